package cli_test

import (
	"fmt"

	"github.com/pgworker/pgworker/cli"
)

func ExampleRedactURL() {
	fmt.Println(cli.RedactURL("postgres://app:s3cret@db:5432/queue?sslmode=require"))
	fmt.Println(cli.RedactURL("host=db user=app password=s3cret dbname=queue"))
	// Output:
	// postgres://app:xxxxx@db:5432/queue?sslmode=require
	// host=db user=app password=xxxxx dbname=queue
}
