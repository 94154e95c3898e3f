package api

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// upstreamDoc is Cloud Hypervisor's own OpenAPI document, kept in the
// shared reference directory beside the repository.
var upstreamDoc = filepath.Join("..", "..", "..", "..", "shared", "reference", "cloud-hypervisor.yaml")

func load(t *testing.T, data []byte, what string) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(data)
	if err != nil {
		t.Fatalf("load %s: %v", what, err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("validate %s: %v", what, err)
	}
	return doc
}

// TestTrueToUpstream checks that every path, operation and schema of
// openapi.yaml is upstream's: same operations, request bodies and
// responses; every schema exists upstream with the same type, required
// properties (all of upstream's) and properties typed as upstream types
// them.
func TestTrueToUpstream(t *testing.T) {
	up, err := os.ReadFile(upstreamDoc)
	if err != nil {
		t.Skipf("upstream document not found at %s (the shared reference directory beside the repository): %v", upstreamDoc, err)
	}
	ours, theirs := load(t, Document, "openapi.yaml"), load(t, up, upstreamDoc)
	if problems := compare(ours, theirs); len(problems) > 0 {
		t.Errorf("openapi.yaml differs from upstream's document:\n%s", strings.Join(problems, "\n"))
	}
}

// TestCompareFindsDifferences proves the comparison fails on a document
// that strays from upstream in each way it checks.
func TestCompareFindsDifferences(t *testing.T) {
	up, err := os.ReadFile(upstreamDoc)
	if err != nil {
		t.Skipf("upstream document not found at %s (the shared reference directory beside the repository): %v", upstreamDoc, err)
	}
	theirs := load(t, up, upstreamDoc)
	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"unknown path", "  /vm.boot:", "  /vm.start:", "path /vm.start"},
		{"other method", "  /vm.boot:\n    put:", "  /vm.boot:\n    post:", "POST /vm.boot"},
		{"property type", "        cid:\n          type: integer", "        cid:\n          type: string", "VsockConfig.cid"},
		{"unknown property", "        tag:\n          type: string", "        tags:\n          type: string", "FsConfig.tags"},
		{"required dropped", "      required:\n        - size\n", "", "MemoryConfig"},
		{"unknown schema", "    VmRemoveDevice:", "    VmUnplug:\n      type: string\n    VmRemoveDevice:", "schema VmUnplug"},
		{"enum", `enum: [Copy, OnDemand]`, `enum: [Copy, Lazy]`, "MemoryRestoreMode"},
		{"response", "          description: The VM instance successfully booted.", "          description: The VM instance successfully booted.\n        202:\n          description: later", "PUT /vm.boot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed := strings.Replace(string(Document), tc.old, tc.new, 1)
			if changed == string(Document) {
				t.Fatalf("the test's edit %q does not apply to openapi.yaml", tc.old)
			}
			doc, err := openapi3.NewLoader().LoadFromData([]byte(changed))
			if err != nil {
				t.Fatalf("load edited document: %v", err)
			}
			problems := strings.Join(compare(doc, theirs), "\n")
			if !strings.Contains(problems, tc.want) {
				t.Errorf("compare(edited) = %q, want a problem naming %q", problems, tc.want)
			}
		})
	}
}

// compare lists how ours strays from upstream: paths, operations or
// schemas upstream lacks, or declares otherwise.
func compare(ours, up *openapi3.T) []string {
	var out []string
	for path, item := range ours.Paths.Map() {
		upItem := up.Paths.Value(path)
		if upItem == nil {
			out = append(out, fmt.Sprintf("path %s: not in upstream", path))
			continue
		}
		for method, op := range item.Operations() {
			upOp := upItem.GetOperation(method)
			if upOp == nil {
				out = append(out, fmt.Sprintf("%s %s: not in upstream", method, path))
				continue
			}
			out = append(out, compareOps(method+" "+path, op, upOp)...)
		}
	}
	for name, s := range ours.Components.Schemas {
		upS, ok := up.Components.Schemas[name]
		if !ok {
			out = append(out, fmt.Sprintf("schema %s: not in upstream", name))
			continue
		}
		out = append(out, compareSchema(name, s, upS, true)...)
	}
	sort.Strings(out)
	return out
}

func compareOps(where string, op, up *openapi3.Operation) []string {
	var out []string
	if op.OperationID != up.OperationID {
		out = append(out, fmt.Sprintf("%s: operationId %q, upstream %q", where, op.OperationID, up.OperationID))
	}
	if (op.RequestBody == nil) != (up.RequestBody == nil) {
		out = append(out, fmt.Sprintf("%s: request body differs from upstream", where))
	} else if op.RequestBody != nil {
		out = append(out, compareContent(where+" request", op.RequestBody.Value.Content, up.RequestBody.Value.Content)...)
		if op.RequestBody.Value.Required != up.RequestBody.Value.Required {
			out = append(out, fmt.Sprintf("%s: request body required differs from upstream", where))
		}
	}
	codes, upCodes := op.Responses.Map(), up.Responses.Map()
	if !reflect.DeepEqual(sortedKeys(codes), sortedKeys(upCodes)) {
		out = append(out, fmt.Sprintf("%s: responses %v, upstream %v", where, sortedKeys(codes), sortedKeys(upCodes)))
	}
	for code, r := range codes {
		if u, ok := upCodes[code]; ok {
			out = append(out, compareContent(fmt.Sprintf("%s response %s", where, code), r.Value.Content, u.Value.Content)...)
		}
	}
	return out
}

func compareContent(where string, c, up openapi3.Content) []string {
	if !reflect.DeepEqual(sortedKeys(c), sortedKeys(up)) {
		return []string{fmt.Sprintf("%s: media types %v, upstream %v", where, sortedKeys(c), sortedKeys(up))}
	}
	var out []string
	for mt, m := range c {
		out = append(out, compareSchema(where+" "+mt, m.Schema, up[mt].Schema, false)...)
	}
	return out
}

// compareSchema compares s with upstream's u. A referenced schema is
// compared by name (it is checked on its own). At the top of a named
// schema (top), ours may keep fewer properties than upstream, but every
// one upstream requires.
func compareSchema(where string, s, u *openapi3.SchemaRef, top bool) []string {
	if s == nil || u == nil {
		if s != u {
			return []string{where + ": schema differs from upstream"}
		}
		return nil
	}
	if !top && (s.Ref != "" || u.Ref != "") {
		if s.Ref != u.Ref {
			return []string{fmt.Sprintf("%s: refers to %q, upstream %q", where, s.Ref, u.Ref)}
		}
		return nil
	}
	a, b := s.Value, u.Value
	var out []string
	differ := func(what string, x, y any) {
		if !reflect.DeepEqual(x, y) {
			out = append(out, fmt.Sprintf("%s: %s %v, upstream %v", where, what, x, y))
		}
	}
	differ("type", a.Type, b.Type)
	differ("format", a.Format, b.Format)
	differ("enum", a.Enum, b.Enum)
	differ("default", a.Default, b.Default)
	differ("minimum", a.Min, b.Min)
	differ("maximum", a.Max, b.Max)
	differ("nullable", a.Nullable, b.Nullable)
	differ("required", sortedCopy(a.Required), sortedCopy(b.Required))
	for name, p := range a.Properties {
		up, ok := b.Properties[name]
		if !ok {
			out = append(out, fmt.Sprintf("%s.%s: no such property upstream", where, name))
			continue
		}
		out = append(out, compareSchema(where+"."+name, p, up, false)...)
	}
	if a.Items != nil || b.Items != nil {
		out = append(out, compareSchema(where+"[]", a.Items, b.Items, false)...)
	}
	if a.AdditionalProperties.Schema != nil || b.AdditionalProperties.Schema != nil {
		out = append(out, compareSchema(where+"{}", a.AdditionalProperties.Schema, b.AdditionalProperties.Schema, false)...)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func sortedCopy(s []string) []string {
	c := append([]string(nil), s...)
	sort.Strings(c)
	return c
}
