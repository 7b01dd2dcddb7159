package blob

import (
	"fmt"
	"strings"
)

// Resolver maps the source of a row to a store and a key. A plain key is
// read from the input store; a full s3:// or file:// URL is accepted only
// when it lies inside the input store or one of the extra stores, so that a
// row cannot make a worker read whatever its credentials or file system
// reach.
type Resolver struct {
	input  Store
	stores []Store
}

// NewResolver returns a Resolver for plain keys in input (nil: plain keys
// are refused) and full URLs inside input or extra. The Resolver does not
// own the stores: close them after use.
func NewResolver(input Store, extra ...Store) *Resolver {
	r := &Resolver{input: input}
	if input != nil {
		r.stores = append(r.stores, input)
	}
	r.stores = append(r.stores, extra...)
	return r
}

// Resolve returns the store holding source and its key there. Errors wrap
// ErrInvalidKey or ErrInvalidURL, and so are permanent.
func (r *Resolver) Resolve(source string) (Store, string, error) {
	// "://" cannot occur in a valid key (no empty segments), so a source
	// holding it is a URL.
	if !strings.Contains(source, "://") {
		if err := ValidateKey(source); err != nil {
			return nil, "", fmt.Errorf("source: %w", err)
		}
		if r.input == nil {
			return nil, "", fmt.Errorf("%w: source %s is a plain key, but no input store is configured", ErrInvalidURL, quoteKey(source))
		}
		return r.input, source, nil
	}
	loc, key, err := SplitURL(source)
	if err != nil {
		return nil, "", fmt.Errorf("source: %w", err)
	}
	for _, s := range r.stores {
		if rel, ok := s.Location().Contains(loc, key); ok {
			return s, rel, nil
		}
	}
	where := make([]string, len(r.stores))
	for i, s := range r.stores {
		where[i] = s.Location().String()
	}
	return nil, "", fmt.Errorf("%w: source %s is outside the configured stores (%s)", ErrInvalidURL, quoteKey(source), strings.Join(where, ", "))
}
