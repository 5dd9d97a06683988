package txhook_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// generatedDB is the import path of txhook's sqlc-generated queries: ours,
// not the users'. Renaming one of our queries must not break an
// application.
const generatedDB = "github.com/txhook/txhook/db"

// TestPublicAPIHasNoGeneratedTypes: no exported name of the root package or
// of handler takes or returns a type of the generated db package, and
// handler does not import it at all (it talks to the root package only).
func TestPublicAPIHasNoGeneratedTypes(t *testing.T) {
	for _, dir := range []string{".", "handler"} {
		fset := token.NewFileSet()
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			local := ""
			for _, imp := range f.Imports {
				if p, _ := strconv.Unquote(imp.Path.Value); p == generatedDB {
					local = "db"
					if imp.Name != nil {
						local = imp.Name.Name
					}
				}
			}
			if local == "" {
				continue
			}
			if dir == "handler" {
				t.Errorf("%s imports the generated db package", name)
				continue
			}
			for _, d := range f.Decls {
				for _, where := range exportedTypes(d) {
					ast.Inspect(where, func(n ast.Node) bool {
						if sel, ok := n.(*ast.SelectorExpr); ok {
							if id, ok := sel.X.(*ast.Ident); ok && id.Name == local {
								t.Errorf("%s: exported API uses %s.%s", fset.Position(sel.Pos()), local, sel.Sel.Name)
							}
						}
						return true
					})
				}
			}
		}
	}
}

// exportedTypes returns the parts of d that users see: the signatures of
// exported functions and methods, and exported types, variables and
// constants (with their exported fields and methods).
func exportedTypes(d ast.Decl) []ast.Node {
	var out []ast.Node
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Name.IsExported() && (d.Recv == nil || exportedRecv(d.Recv)) {
			out = append(out, d.Type)
		}
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				if !s.Name.IsExported() {
					continue
				}
				if st, ok := s.Type.(*ast.StructType); ok {
					for _, f := range st.Fields.List {
						for _, n := range f.Names {
							if n.IsExported() {
								out = append(out, f.Type)
							}
						}
					}
					continue
				}
				out = append(out, s.Type)
			case *ast.ValueSpec:
				for _, n := range s.Names {
					if n.IsExported() && s.Type != nil {
						out = append(out, s.Type)
					}
				}
			}
		}
	}
	return out
}

func exportedRecv(r *ast.FieldList) bool {
	t := r.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	id, ok := t.(*ast.Ident)
	return ok && id.IsExported()
}
