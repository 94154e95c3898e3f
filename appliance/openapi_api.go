package appliance

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"gopkg.in/yaml.v3"

	"hearth/appliance/api"
)

// GET /openapi.yaml and /openapi.json serve the API's own document, so
// that clients in any language can be generated from the daemon they
// talk to, and the dashboard can show its API reference. Both are
// public on TCP, like the dashboard's files: the document is the same
// in every build and holds no secret (requireToken's public).

func (s *server) GetOpenAPIDocument(w http.ResponseWriter, r *http.Request) {
	serveDocument(w, r, "application/yaml; charset=utf-8", api.Document)
}

func (s *server) GetOpenAPIDocumentJSON(w http.ResponseWriter, r *http.Request) {
	doc, err := documentJSON()
	if err != nil {
		fail(w, apiError(err))
		return
	}
	serveDocument(w, r, "application/json", doc)
}

func serveDocument(w http.ResponseWriter, r *http.Request, contentType string, body []byte) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-cache")
	w.Write(body)
}

// documentJSON is the document converted to JSON once.
var documentJSON = sync.OnceValues(func() ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(api.Document, &doc); err != nil {
		return nil, fmt.Errorf("the embedded openapi.yaml: %w", err)
	}
	return json.Marshal(doc)
})
