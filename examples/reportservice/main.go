package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"

	_ "modernc.org/sqlite"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	path := flag.String("db", "reports.db", "the service's SQLite database")
	var resources list
	flag.Var(&resources, "resource", "a resource to accept reports for (repeatable)")
	flag.Parse()
	if len(resources) == 0 {
		fmt.Fprintln(os.Stderr, "reportservice: give at least one -resource")
		os.Exit(2)
	}
	db, err := sql.Open("sqlite", "file:"+*path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	h, err := NewHandler(context.Background(), db, resources)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("reportservice: listening on %s", *addr)
	log.Fatal(http.ListenAndServe(*addr, h))
}
