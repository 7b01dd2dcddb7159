package cli

import (
	"net/url"
	"regexp"
	"strings"
)

// redacted replaces a password wherever pgworker shows a connection string.
const redacted = "xxxxx"

var (
	// password=... and sslpassword=... in keyword/value strings and URL queries.
	kvPassword = regexp.MustCompile(`((?:^|[\s&?])(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)`)
)

// RedactURL returns a database URL (postgres://user:password@host/db?...)
// or keyword/value connection string (host=db password=...) with every
// password replaced by xxxxx: the password of the user info, and the
// password and sslpassword parameters. Use it wherever a connection string
// could be printed or logged. A string it cannot make sense of is redacted
// as far as possible, never returned with a password in clear.
func RedactURL(s string) string {
	s = kvPassword.ReplaceAllString(s, "${1}"+redacted)
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	at := userInfoEnd(rest)
	if at < 0 {
		return s
	}
	if user, _, has := strings.Cut(rest[:at], ":"); has {
		return scheme + "://" + user + ":" + redacted + rest[at:]
	}
	return s
}

// userInfoEnd finds the @ that ends the user info of a URL without its
// scheme, or -1. It takes the last @ before the query, so that a password
// with an unescaped @ or / (which url.Parse would cut short) is found whole;
// a password with an unescaped ? or # makes it look further.
func userInfoEnd(rest string) int {
	end := len(rest)
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		end = i
	}
	if at := strings.LastIndex(rest[:end], "@"); at >= 0 {
		return at
	}
	return strings.LastIndex(rest, "@")
}

// passwords returns the passwords a connection string holds, raw and
// unescaped, so that they can be scrubbed from error messages that quote
// them in unexpected ways.
func passwords(conn string) []string {
	var out []string
	add := func(p string) {
		if len(p) >= 4 && p != redacted {
			out = append(out, p)
		}
	}
	for _, m := range kvPassword.FindAllStringSubmatch(conn, -1) {
		add(strings.Trim(m[2], "'"))
	}
	if _, rest, ok := strings.Cut(conn, "://"); ok {
		if at := userInfoEnd(rest); at >= 0 {
			if _, p, has := strings.Cut(rest[:at], ":"); has {
				add(p)
				if up, err := url.PathUnescape(p); err == nil && up != p {
					add(up)
				}
			}
		}
	}
	return out
}

// scrub removes the passwords of the given connection strings from msg.
func scrub(msg string, conns ...string) string {
	for _, c := range conns {
		for _, p := range passwords(c) {
			msg = strings.ReplaceAll(msg, p, redacted)
		}
	}
	return msg
}

// hasPassword reports whether a connection string holds a password.
func hasPassword(conn string) bool {
	for _, m := range kvPassword.FindAllStringSubmatch(conn, -1) {
		if strings.Trim(m[2], "'") != "" {
			return true
		}
	}
	if _, rest, ok := strings.Cut(conn, "://"); ok {
		if at := userInfoEnd(rest); at >= 0 {
			_, p, has := strings.Cut(rest[:at], ":")
			return has && p != ""
		}
	}
	return false
}
