package appliance

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"testing"
)

// services are the Daemon's fields that hold a service, and their types.
var services = map[string]string{"sbx": "sandboxManager", "ports": "previews", "agents": "agentService", "sched": "scheduleService", "images": "imageService"}

// TestHandlersAreThin: the handler files (*_api.go, see doc.go) reach a
// service only through its exported methods: no unexported method, no
// field (so no lock), whether through s.d.sbx or a variable holding it.
func TestHandlersAreThin(t *testing.T) {
	files, err := filepath.Glob("*_api.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no handler files: %v", err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			for _, bad := range serviceInternals(fn) {
				t.Errorf("%s: %s reaches into a service: %s", fset.Position(bad.Pos()), fn.Name.Name, exprString(bad))
			}
		}
	}
}

// serviceInternals returns the selectors in fn of an unexported name of
// a service.
func serviceInternals(fn *ast.FuncDecl) []*ast.SelectorExpr {
	held := map[string]bool{} // variables and parameters that hold a service
	if fn.Type.Params != nil {
		for _, p := range fn.Type.Params.List {
			if star, ok := p.Type.(*ast.StarExpr); ok && isServiceType(star.X) {
				for _, n := range p.Names {
					held[n.Name] = true
				}
			}
		}
	}
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		if as, ok := n.(*ast.AssignStmt); ok && len(as.Lhs) == len(as.Rhs) {
			for i, rhs := range as.Rhs {
				if id, ok := as.Lhs[i].(*ast.Ident); ok && isService(rhs, held) {
					held[id.Name] = true
				}
			}
		}
		return true
	})
	var bad []*ast.SelectorExpr
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok && isService(sel.X, held) && !sel.Sel.IsExported() {
			bad = append(bad, sel)
		}
		return true
	})
	return bad
}

// isService says whether e is s.d.<service> or a variable holding one.
func isService(e ast.Expr, held map[string]bool) bool {
	switch e := e.(type) {
	case *ast.Ident:
		return held[e.Name]
	case *ast.SelectorExpr:
		d, ok := e.X.(*ast.SelectorExpr)
		return ok && d.Sel.Name == "d" && services[e.Sel.Name] != ""
	}
	return false
}

func isServiceType(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	if !ok {
		return false
	}
	for _, t := range services {
		if id.Name == t {
			return true
		}
	}
	return false
}

func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return exprString(e.X) + "." + e.Sel.Name
	}
	return "?"
}
