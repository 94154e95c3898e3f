package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra/doc"
	flag "github.com/spf13/pflag"
)

// The CLI reference in docs/cli/ is generated from the command tree:
// markdown and man pages. `go generate ./cmd/hearth` writes them again;
// TestDocsCurrent fails when the checked-in files differ.

//go:generate go run . __docs ../../docs/cli

func docsCmd() *command {
	return &command{name: "__docs", args: "DIR", min: 1, max: 1, hidden: true, setup: cmdDocs,
		summary: "write the CLI reference (markdown and man pages) into DIR",
		example: "hearth __docs docs/cli"}
}

// manDate is the date the man pages carry: fixed, so that generating
// them again changes nothing unless the commands did.
var manDate = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func cmdDocs(*flag.FlagSet) action {
	return func(inv *env) error { return writeDocs(inv, inv.args[0]) }
}

func writeDocs(inv *env, dir string) error {
	root := inv.root
	root.DisableAutoGenTag = true
	man := filepath.Join(dir, "man")
	if err := os.MkdirAll(man, 0o755); err != nil {
		return fmt.Errorf("make %s: %w", man, err)
	}
	if err := doc.GenMarkdownTree(root, dir); err != nil {
		return fmt.Errorf("write markdown in %s: %w", dir, err)
	}
	header := &doc.GenManHeader{Title: "HEARTH", Section: "1", Date: &manDate, Source: "Hearth", Manual: "Hearth manual"}
	if err := doc.GenManTree(root, header, man); err != nil {
		return fmt.Errorf("write man pages in %s: %w", man, err)
	}
	return nil
}
