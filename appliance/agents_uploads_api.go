package appliance

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"
)

// A delegate or resume request may come as multipart/form-data instead of
// JSON, so that big input files are streamed, never held in memory by the
// client or the daemon: a first part named "request" holds the JSON
// request, and each part named "input" is one file, by its file name.
// The files go to a staging directory under <state_dir>/uploads, which
// the runner copies into the session's inputs/; it is removed once the
// execution has ended (or was refused).

// MaxInputFiles bounds the input files of one multipart request, in all.
const MaxInputFiles = 1 << 30

// maxRequestPart bounds the JSON part of a multipart request: the
// request without inputs, a prompt of up to maxPrompt JSON-escaped.
const maxRequestPart = 8 * maxPrompt

// isMultipart says the request is multipart/form-data.
func isMultipart(r *http.Request) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == "multipart/form-data"
}

// decodeTask decodes a delegate or resume request into v: JSON, or
// multipart, whose files are staged. It answers the error itself and
// returns ok false; otherwise the caller owns staging ("" for none) and
// must remove it.
func (s *server) decodeTask(w http.ResponseWriter, r *http.Request, v any) (files map[string]string, staging string, ok bool) {
	if !isMultipart(r) {
		return nil, "", decode(w, r, maxTaskBody, v)
	}
	files, staging, err := s.stageTask(r, v)
	if err != nil {
		if staging != "" {
			os.RemoveAll(staging)
		}
		fail(w, apiError(err))
		return nil, "", false
	}
	return files, staging, true
}

func (s *server) stageTask(r *http.Request, v any) (map[string]string, string, error) {
	mr, err := r.MultipartReader()
	if err != nil {
		return nil, "", invalidf("request body: %v", err)
	}
	part, err := mr.NextPart()
	if err != nil || part.FormName() != "request" {
		return nil, "", invalidf("request body: the first part must be \"request\", the JSON request")
	}
	dec := json.NewDecoder(io.LimitReader(part, maxRequestPart))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return nil, "", invalidf("request body: request: %v", err)
	}
	uploads := s.d.agents.UploadsDir()
	if err := os.MkdirAll(uploads, 0o700); err != nil {
		return nil, "", err
	}
	staging, err := os.MkdirTemp(uploads, "task-")
	if err != nil {
		return nil, "", err
	}
	files := map[string]string{}
	var total int64
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return files, staging, nil
		}
		if err != nil {
			return nil, staging, invalidf("request body: %v", err)
		}
		name := part.FileName()
		if part.FormName() != "input" || checkInputs(map[string][]byte{name: nil}) != nil || files[name] != "" {
			return nil, staging, invalidf("request body: part %q (%q): want parts named input, each a file with a plain file name, once", part.FormName(), name)
		}
		n, err := stageFile(filepath.Join(staging, name), part, MaxInputFiles-total)
		if err != nil {
			return nil, staging, err
		}
		total += n
		files[name] = filepath.Join(staging, name)
	}
}

// stageFile copies r to file, refusing more than max bytes.
func stageFile(file string, r io.Reader, max int64) (int64, error) {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, io.LimitReader(r, max+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > max {
		err = tooLargef("the input files are more than the %d bytes (1 GiB) a task may have", int64(MaxInputFiles))
	}
	if err != nil && !isDomain(err) {
		err = fmt.Errorf("stage input %s: %w", filepath.Base(file), err)
	}
	return n, err
}
