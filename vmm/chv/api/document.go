package api

import _ "embed"

// Document is openapi.yaml, the source of the generated code: the
// contract double validates every request against it.
//
//go:embed openapi.yaml
var Document []byte
