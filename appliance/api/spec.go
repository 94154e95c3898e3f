package api

import _ "embed" // the document itself

// Document is openapi.yaml, the document this package is generated from,
// as the daemon serves it at GET /openapi.yaml.
//
//go:embed openapi.yaml
var Document []byte
