package main

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
)

// maxRecord bounds a recorded body, as the server bounds what it reads.
const maxRecord = 32 << 20

// recordRequests writes each request's body to dir as
// NNNN-PATH.json (0001-v1-responses.json ...), in the order they come,
// so that what a real CLI sends can be kept as test data, then hands the
// request on unchanged. A body that cannot be written is logged, never
// silently lost, and the request is still answered.
func recordRequests(h http.Handler, dir string, logger *log.Logger) http.Handler {
	var n atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxRecord+1))
		r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), r.Body))
		name := filepath.Join(dir, fmt.Sprintf("%04d-%s.json", n.Add(1), slug(r.URL.Path)))
		if err == nil {
			err = os.WriteFile(name, body, 0o644)
		}
		if err != nil {
			logger.Printf("--record: %s: %v", name, err)
		}
		h.ServeHTTP(w, r)
	})
}

// slug is a path as a file name: v1-responses,
// v1beta-models-gemini-2.5-pro-streamGenerateContent.
func slug(path string) string {
	s := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' {
			return r
		}
		return '-'
	}, strings.Trim(path, "/"))
	s = strings.ReplaceAll(s, "..", "-")
	if len(s) > 100 {
		s = s[:100]
	}
	if s == "" {
		s = "root"
	}
	return s
}
