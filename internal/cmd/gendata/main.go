// Command gendata writes the sample data set in testdata/inputs: prose (.txt),
// sales records (.csv) and web server logs (.log) of many sizes, plus a few
// damaged files that the sample backend refuses on purpose. The output is the
// same on every run.
//
//	go run ./internal/cmd/gendata testdata/inputs
package main

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
)

var words = strings.Fields(`
the of and to in a is that for it as was with be by on not he this are or his from
at which but have an they you were her she there been one all we their has would when
what more if no out so said up its about into than them can only other time new some
could these two may first then do any like my now over such our man me even most made
after also did many before must through back years where much your way well down should
because each just those people how too little state good very make world still own see
men work long get here between both life being under never day same another know while
last might us great old year off come since against go came right used take three
river harbour lantern orchard granite meadow ledger furnace compass ferry quarry
archive signal mill valley bridge canal winter harvest market station engine
`)

var (
	regions  = []string{"north", "south", "east", "west", "central"}
	products = []string{"bolts", "nuts", "washers", "hinges", "brackets", "springs", "rivets", "clamps"}
	paths    = []string{"/", "/index.html", "/api/items", "/api/items/42", "/login", "/static/app.js", "/static/site.css", "/search?q=river", "/healthz", "/admin"}
	statuses = []int{200, 200, 200, 200, 200, 304, 301, 404, 500, 403}
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gendata DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fail(err)
	}
	r := rand.New(rand.NewPCG(2026, 11))
	for i := 1; i <= 80; i++ {
		write(dir, fmt.Sprintf("notes/essay-%03d.txt", i), prose(r, 10+r.IntN(300)))
	}
	for i := 1; i <= 70; i++ {
		write(dir, fmt.Sprintf("sales/sales-%03d.csv", i), sales(r, 20+r.IntN(1200)))
	}
	for i := 1; i <= 50; i++ {
		write(dir, fmt.Sprintf("logs/access-%03d.log", i), accessLog(r, 50+r.IntN(1500)))
	}
	// Damaged inputs: the backend fails on these on purpose.
	for i := 1; i <= 6; i++ {
		body := sales(r, 20)
		body = body[strings.IndexByte(body, '\n')+1:] // header lost
		write(dir, fmt.Sprintf("sales/damaged-%02d.csv", i), body)
	}
}

func prose(r *rand.Rand, sentences int) string {
	var b strings.Builder
	for s := 0; s < sentences; s++ {
		n := 5 + r.IntN(14)
		for w := 0; w < n; w++ {
			word := words[r.IntN(len(words))]
			if w == 0 {
				word = strings.ToUpper(word[:1]) + word[1:]
			}
			b.WriteString(word)
			if w < n-1 {
				b.WriteByte(' ')
			}
		}
		b.WriteString(". ")
		if r.IntN(6) == 0 {
			b.WriteString("\n\n")
		}
	}
	b.WriteByte('\n')
	return b.String()
}

func sales(r *rand.Rand, rows int) string {
	var b strings.Builder
	b.WriteString("date,region,product,units,unit_price\n")
	for i := 0; i < rows; i++ {
		fmt.Fprintf(&b, "2026-%02d-%02d,%s,%s,%d,%d.%02d\n", 1+r.IntN(12), 1+r.IntN(28),
			regions[r.IntN(len(regions))], products[r.IntN(len(products))], 1+r.IntN(500), r.IntN(90), r.IntN(100))
	}
	return b.String()
}

func accessLog(r *rand.Rand, lines int) string {
	var b strings.Builder
	for i := 0; i < lines; i++ {
		fmt.Fprintf(&b, "192.0.2.%d - - [29/Nov/2026:%02d:%02d:%02d +0000] \"GET %s HTTP/1.1\" %d %d\n",
			1+r.IntN(60), r.IntN(24), r.IntN(60), r.IntN(60), paths[r.IntN(len(paths))],
			statuses[r.IntN(len(statuses))], 100+r.IntN(50000))
	}
	return b.String()
}

func write(dir, name, body string) {
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		fail(err)
	}
	f, err := os.Create(p)
	if err != nil {
		fail(err)
	}
	w := bufio.NewWriter(f)
	w.WriteString(body)
	if err := w.Flush(); err != nil {
		fail(err)
	}
	if err := f.Close(); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gendata:", err)
	os.Exit(1)
}
