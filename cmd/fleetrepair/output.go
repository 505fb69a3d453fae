package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// Output formats of the client commands (-o): table is the default for
// people, wide adds columns, json and yaml print what the API answered.
const (
	outTable = "table"
	outWide  = "wide"
	outJSON  = "json"
	outYAML  = "yaml"
)

// addOutputFlag registers -o/--output on cmd (persistent) with the formats
// it takes, checked before the command runs.
func addOutputFlag(cmd *cobra.Command, formats ...string) *string {
	o := new(string)
	cmd.PersistentFlags().StringVarP(o, "output", "o", outTable, "output format: "+strings.Join(formats, ", "))
	prev := cmd.PersistentPreRunE
	cmd.PersistentPreRunE = func(c *cobra.Command, args []string) error {
		if !slices.Contains(formats, *o) {
			return fmt.Errorf("--output %q: want %s", *o, strings.Join(formats, ", "))
		}
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
	return o
}

// printData writes v as indented JSON or as YAML (the JSON field names).
func printData(w io.Writer, format string, v any) error {
	if format == outYAML {
		b, err := yaml.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode yaml: %w", err)
		}
		_, err = w.Write(b)
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// age writes a duration the way kubectl does: 45s, 12m, 3h20m, 2d4h.
func age(d time.Duration) string {
	if d < 0 {
		return "-" + age(-d)
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 10*time.Minute:
		m, s := int(d.Minutes()), int(d.Seconds())%60
		if s == 0 {
			return fmt.Sprintf("%dm", m)
		}
		return fmt.Sprintf("%dm%ds", m, s)
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 24*time.Hour:
		h, m := int(d.Hours()), int(d.Minutes())%60
		if m == 0 {
			return fmt.Sprintf("%dh", h)
		}
		return fmt.Sprintf("%dh%dm", h, m)
	default:
		days, h := int(d.Hours())/24, int(d.Hours())%24
		if h == 0 {
			return fmt.Sprintf("%dd", days)
		}
		return fmt.Sprintf("%dd%dh", days, h)
	}
}

func ts(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// quote is s as one shell word for a command line the user may paste.
func quote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_=./:,@", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// allPages fetches the page at cursor, or with all every page from there
// on, following the API's keyset cursors. fetch returns one page's items and
// the next cursor ("" at the end); allPages returns the items (never nil) and
// the cursor of the page after them.
func allPages[T any](all bool, cursor string, fetch func(cursor string) ([]T, string, error)) ([]T, string, error) {
	items := []T{}
	for {
		got, next, err := fetch(cursor)
		if err != nil {
			return nil, "", err
		}
		items = append(items, got...)
		if !all || next == "" {
			return items, next, nil
		}
		cursor = next
	}
}

// nextPageHint is the line a list command prints when more pages exist:
// the exact command for the next one ("" when none is left).
func nextPageHint(cmd *cobra.Command, conn *connection, noun, cursor string) string {
	if cursor == "" {
		return ""
	}
	return fmt.Sprintf("more %s exist: next page with\n  %s%s%s --cursor %s\n(or --all for every page)",
		noun, cmd.CommandPath(), listFlags(cmd), conn.again(), cursor)
}

// printListData prints a list page as JSON or YAML with the next-page hint
// on standard error, and reports false for the table formats, which the
// command renders itself.
func printListData(cmd *cobra.Command, format string, page any, next string) (bool, error) {
	if format != outJSON && format != outYAML {
		return false, nil
	}
	if err := printData(cmd.OutOrStdout(), format, page); err != nil {
		return true, err
	}
	if next != "" {
		fmt.Fprintln(cmd.ErrOrStderr(), next)
	}
	return true, nil
}
