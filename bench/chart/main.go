// Command chart draws the samples of a pgworker bench soak or long-tx run
// (its --json line) as a PNG: rows per second, pickup times, the table's and
// its indexes' sizes, and dead tuples and depth, each over time. It is a
// module of its own, so that the plotting library stays out of pgworker's
// dependencies.
//
//	pgworker bench soak --duration 30m --rate 500 --json > soak.json
//	cd bench/chart && go run . -o ../../docs/soak.png ../../soak.json
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// sample is the part of a bench sample that is drawn.
type sample struct {
	AtSec          float64 `json:"at_sec"`
	Phase          string  `json:"phase"`
	RowsPerSec     float64 `json:"rows_per_sec"`
	InsertedPerSec float64 `json:"inserted_per_sec"`
	PickupP50MS    float64 `json:"pickup_p50_ms"`
	PickupP99MS    float64 `json:"pickup_p99_ms"`
	Depth          float64 `json:"depth"`
	DeadTuples     float64 `json:"dead_tuples"`
	LiveTuples     float64 `json:"live_tuples"`
	TableBytes     float64 `json:"table_bytes"`
	IndexBytes     float64 `json:"index_bytes"`
	ClaimIdxBytes  float64 `json:"claim_index_bytes"`
}

// run is the part of a bench result that is drawn.
type run struct {
	Mode    string   `json:"mode"`
	Rate    float64  `json:"rate"`
	Slots   int      `json:"slots"`
	Samples []sample `json:"samples"`
}

func main() {
	out := flag.String("o", "soak.png", "the PNG `file` to write")
	width := flag.Float64("width", 9, "width in inches (at 100 dpi)")
	mode := flag.String("mode", "", "draw the last result of this `mode` (soak, long-tx; default: the last with samples)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: chart [-o FILE.png] RESULT.json\n\nDraws the samples of the last soak or long-tx result in RESULT.json (one JSON object a line).")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if err := drawRun(flag.Arg(0), *mode, *out, *width); err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
}

func drawRun(in, mode, out string, width float64) error {
	r, err := lastRun(in, mode)
	if err != nil {
		return err
	}
	const mib = 1 << 20
	panels := []*plot.Plot{
		panel(r, "rows per second", "rows/s", []series{
			{"done", func(s sample) float64 { return s.RowsPerSec }},
			{"inserted", func(s sample) float64 { return s.InsertedPerSec }},
		}),
		panel(r, "pickup (insert to handler start)", "ms", []series{
			{"p50", func(s sample) float64 { return s.PickupP50MS }},
			{"p99", func(s sample) float64 { return s.PickupP99MS }},
		}),
		panel(r, "files.files size", "MiB", []series{
			{"table", func(s sample) float64 { return s.TableBytes / mib }},
			{"indexes", func(s sample) float64 { return s.IndexBytes / mib }},
			{"files_claim_idx", func(s sample) float64 { return s.ClaimIdxBytes / mib }},
		}),
		panel(r, "tuples and depth", "rows", []series{
			{"dead tuples", func(s sample) float64 { return s.DeadTuples }},
			{"depth (waiting)", func(s sample) float64 { return s.Depth }},
		}),
	}
	w := vg.Length(width) * vg.Inch
	h := w * vg.Length(len(panels)) / 3.2
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(100))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadY: vg.Points(6), PadTop: vg.Points(4), PadBottom: vg.Points(4),
		PadLeft: vg.Points(4), PadRight: vg.Points(8)}
	for i, p := range panels {
		p.Draw(tiles.At(dc, 0, i))
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// lastRun reads the last result of mode (any, if empty) with samples in the
// file.
func lastRun(path, mode string) (*run, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var last *run
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var r run
		if json.Unmarshal(sc.Bytes(), &r) == nil && len(r.Samples) > 0 && (mode == "" || r.Mode == mode) {
			last = &r
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if last == nil {
		return nil, fmt.Errorf("%s holds no %s result with samples (run pgworker bench soak or long-tx with --json)", path, mode)
	}
	return last, nil
}

type series struct {
	name string
	y    func(sample) float64
}

var colors = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
}

// panel draws the series over time in minutes.
func panel(r *run, title, unit string, ss []series) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "minutes"
	p.Y.Label.Text = unit
	p.Y.Min = 0
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	for i, s := range ss {
		xys := make(plotter.XYs, len(r.Samples))
		for j, smp := range r.Samples {
			xys[j] = plotter.XY{X: smp.AtSec / 60, Y: s.y(smp)}
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			continue // a NaN or Inf sample: leave the series out
		}
		l.Color = colors[i%len(colors)]
		l.Width = vg.Points(1.2)
		p.Add(l)
		p.Legend.Add(s.name, l)
	}
	return p
}
