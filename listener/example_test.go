package listener_test

import (
	"context"
	"fmt"
	"os"

	"github.com/pgworker/pgworker/listener"
)

// One LISTEN connection for the process; each consumer subscribes to the
// queues it serves and wakes on its doorbell.
func ExampleListener_Subscribe() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l, err := listener.New(&listener.Config{URL: os.Getenv("PGWORKER_LISTEN_URL")})
	if err != nil {
		panic(err)
	}
	go l.Listen(ctx) //nolint:errcheck // returns nil when ctx ends

	sub := l.Subscribe("default")
	defer sub.Close()
	for range 3 {
		select {
		case <-sub.Doorbell():
			fmt.Println("there may be work in queue default")
		case <-ctx.Done():
			return
		}
	}
}
