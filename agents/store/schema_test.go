package store

import (
	"database/sql"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// tableShape is what TestSchemasMatch compares of a table on both engines.
type tableShape struct {
	Columns []string // name, and "NOT NULL" when it is
	Primary []string
	Foreign []string // column -> table.column
	Unique  []string // column lists of UNIQUE constraints
	Indexes []string // names of indexes made by CREATE INDEX
	Checks  int      // CHECK constraints
}

// TestSchemasMatch: the same migration versions bring SQLite and
// PostgreSQL to equivalent schemas: the same tables and columns, the
// same NOT NULLs, keys, unique constraints, indexes and number of
// checks (PostgreSQL's sessions.rowid stands for SQLite's implicit one).
func TestSchemasMatch(t *testing.T) {
	lite, err := Open(filepath.Join(t.TempDir(), "hearth.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer lite.Close()
	_, dbURL := startPG(t)
	pg := openNodes(t, dbURL, 1)[0]
	vl, _ := lite.SchemaVersion(ctx)
	vp, _ := pg.SchemaVersion(ctx)
	if vl != vp || vl != newestMigration(t) {
		t.Fatalf("schema versions: SQLite %d, PostgreSQL %d, want both %d", vl, vp, newestMigration(t))
	}
	want, got := sqliteShape(t, lite.r), postgresShape(t, pg.r)
	for _, name := range union(keys(want), keys(got)) {
		w, g := fmt.Sprintf("%+v", want[name]), fmt.Sprintf("%+v", got[name])
		if w != g {
			t.Errorf("table %s:\n  SQLite     %s\n  PostgreSQL %s", name, w, g)
		}
	}
	if len(want) < 6 {
		t.Errorf("SQLite has %d tables, want at least 6", len(want))
	}
}

func sqliteShape(t *testing.T, db *sql.DB) map[string]tableShape {
	out := map[string]tableShape{}
	checkRE := regexp.MustCompile(`(?i)\bCHECK\s*\(`)
	for _, tbl := range strs(t, db, "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name != 'goose_db_version'") {
		var sh tableShape
		var ddl string
		db.QueryRow("SELECT sql FROM sqlite_schema WHERE name = ?", tbl).Scan(&ddl)
		sh.Checks = len(checkRE.FindAllString(ddl, -1))
		rows := query(t, db, "SELECT name, \"notnull\", pk FROM pragma_table_info(?) ORDER BY name", tbl)
		pk := map[int]string{}
		for _, r := range rows {
			col := r[0]
			if r[1] == "1" || r[2] != "0" {
				col += " NOT NULL"
			}
			sh.Columns = append(sh.Columns, col)
			if r[2] != "0" {
				var n int
				fmt.Sscan(r[2], &n)
				pk[n] = r[0]
			}
		}
		for i := 1; i <= len(pk); i++ {
			sh.Primary = append(sh.Primary, pk[i])
		}
		for _, r := range query(t, db, "SELECT \"from\", \"table\", COALESCE(\"to\", '') FROM pragma_foreign_key_list(?)", tbl) {
			to := r[2]
			if to == "" {
				to = "id"
			}
			sh.Foreign = append(sh.Foreign, r[0]+" -> "+r[1]+"."+to)
		}
		for _, r := range query(t, db, "SELECT name, origin FROM pragma_index_list(?)", tbl) {
			switch r[1] {
			case "c":
				sh.Indexes = append(sh.Indexes, r[0])
			case "u":
				sh.Unique = append(sh.Unique, strings.Join(strs(t, db, "SELECT name FROM pragma_index_info(?) ORDER BY seqno", r[0]), ","))
			}
		}
		out[tbl] = sh.sorted()
	}
	return out
}

func postgresShape(t *testing.T, db *sql.DB) map[string]tableShape {
	out := map[string]tableShape{}
	for _, tbl := range strs(t, db, "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_name != 'goose_db_version'") {
		var sh tableShape
		for _, r := range query(t, db, "SELECT column_name, is_nullable FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = ? ORDER BY column_name", tbl) {
			if tbl == "sessions" && r[0] == "rowid" {
				continue
			}
			col := r[0]
			if r[1] == "NO" {
				col += " NOT NULL"
			}
			sh.Columns = append(sh.Columns, col)
		}
		cons := query(t, db, `SELECT c.contype::text,
			(SELECT string_agg(a.attname, ',' ORDER BY k.i) FROM unnest(c.conkey) WITH ORDINALITY k(n, i)
				JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n),
			COALESCE(c.confrelid::regclass::text, ''),
			COALESCE((SELECT string_agg(a.attname, ',') FROM unnest(c.confkey) k(n)
				JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n), '')
			FROM pg_constraint c WHERE c.conrelid = ?::regclass`, tbl)
		for _, r := range cons {
			switch r[0] {
			case "p":
				sh.Primary = strings.Split(r[1], ",")
			case "f":
				sh.Foreign = append(sh.Foreign, r[1]+" -> "+r[2]+"."+r[3])
			case "u":
				if !(tbl == "sessions" && r[1] == "rowid") {
					sh.Unique = append(sh.Unique, r[1])
				}
			case "c":
				sh.Checks++
			}
		}
		sh.Indexes = strs(t, db, `SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
			WHERE x.indrelid = ?::regclass AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)`, tbl)
		out[tbl] = sh.sorted()
	}
	return out
}

func (sh tableShape) sorted() tableShape {
	for _, l := range [][]string{sh.Columns, sh.Foreign, sh.Unique, sh.Indexes} {
		slices.Sort(l)
	}
	return sh
}

func query(t *testing.T, db *sql.DB, q string, args ...any) [][]string {
	t.Helper()
	rows, err := db.Query(q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out [][]string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		row := make([]string, len(cols))
		for i, v := range vals {
			row[i] = v.String
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func strs(t *testing.T, db *sql.DB, q string, args ...any) []string {
	t.Helper()
	var out []string
	for _, r := range query(t, db, q, args...) {
		out = append(out, r[0])
	}
	return out
}

func keys(m map[string]tableShape) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func union(a, b []string) []string {
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	return slices.Compact(out)
}
