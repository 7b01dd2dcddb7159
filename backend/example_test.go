package backend_test

import (
	"errors"
	"fmt"

	"github.com/pgworker/pgworker/backend"
)

func ExampleSplit() {
	words, err := backend.Split(`convert "my photo.jpg" -resize 50% $HOME/out.png; rm -rf /`)
	if err != nil {
		panic(err)
	}
	for _, w := range words {
		fmt.Printf("%q\n", w)
	}
	// Output:
	// "convert"
	// "my photo.jpg"
	// "-resize"
	// "50%"
	// "$HOME/out.png;"
	// "rm"
	// "-rf"
	// "/"
}

func ExampleParse() {
	tmpl, err := backend.Parse(`convert {input} -resize 50% '{output_dir}/small {id}.png'`)
	if err != nil {
		panic(err)
	}
	argv := tmpl.Expand(&backend.Job{ID: 42, Input: "/work/in/a b; $(rm -rf x).jpg", OutputDir: "/work/out"})
	fmt.Printf("%q\n", argv)
	// Output:
	// ["convert" "/work/in/a b; $(rm -rf x).jpg" "-resize" "50%" "/work/out/small 42.png"]
}

func ExampleParse_errors() {
	for _, cmd := range []string{`convert '{input}`, `convert {inptu}`, `awk '{print $1}' {input}`} {
		_, err := backend.Parse(cmd)
		var se *backend.SyntaxError
		if errors.As(err, &se) {
			fmt.Println(se)
		}
	}
	// Output:
	// column 9: unterminated single quote: add the closing '
	// column 9: unknown placeholder {inptu} (known: {input} {output_dir} {id} {source} {attempt} {queue} {work_dir} {payload_file}; write {{ and }} for literal braces)
	// column 6: unknown placeholder {print $1} (known: {input} {output_dir} {id} {source} {attempt} {queue} {work_dir} {payload_file}; write {{ and }} for literal braces)
}
