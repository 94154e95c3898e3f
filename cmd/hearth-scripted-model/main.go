// Command hearth-scripted-model is a scripted stand-in for the Anthropic
// Messages API (and OpenAI's Responses and Chat Completions APIs and
// Gemini's generateContent, on their own paths, playing the same script),
// for demos and tests on machines that reach no model
// provider. It is not a model: it answers every request with the next
// turn of a script (its built-in demo, or a JSON file), whatever it is
// asked. It checks each request as the real API does (route, API key,
// version header, body) and refuses malformed ones, so an agent that
// works against it speaks the real protocol. Point the daemon at it with
// [model] upstream = "http://127.0.0.1:8089" and the same key.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"hearth/agents/scriptedmodel"
)

const usage = `hearth-scripted-model: a scripted stand-in for the Anthropic Messages API

It is NOT a model. It answers every POST /v1/messages with the next turn of
a script, whatever it is asked, for demos and tests on machines that reach
no model provider. Requests are checked as the real API checks them (route,
x-api-key, anthropic-version, body); malformed ones are refused. The same
script plays over OpenAI's APIs (POST /v1/responses, /v1/chat/completions,
with Authorization: Bearer KEY) and Gemini's (POST
/v1beta/models/MODEL:generateContent or :streamGenerateContent?alt=sse,
with x-goog-api-key: KEY), each checked as its provider checks it.

The built-in demo script plays, in each conversation: look at inputs/ with
the Bash tool, write outputs/report.md (rows and column totals of each CSV
file, computed by awk in the agent's machine), answer with a summary.

Usage:
  hearth-scripted-model [--listen ADDR] [--key KEY | --key-file FILE] [--script FILE.json] [--record DIR]
  hearth-scripted-model --print-demo      print the demo script as JSON, to copy and edit

Flags:
  --listen ADDR      where to serve (default 127.0.0.1:8089)
  --key KEY          the API key requests must carry (default sk-scripted-demo)
  --key-file FILE    read the key from FILE instead
  --script FILE      play this JSON script instead of the demo (see --print-demo)
  --record DIR       write each request's body to DIR as NNNN-PATH.json, to keep
                     what a real CLI sends (DIR must exist)

Then, in hearth.toml:
  [model]
  upstream = "http://127.0.0.1:8089"
  api_key_file = "/path/to/a/file/holding/the/key"
`

// DefaultKey is the key the stand-in requires unless told another.
const DefaultKey = "sk-scripted-demo"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, nil))
}

// run serves until ctx is done; ready, if set, is told the address.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, ready func(addr string)) int {
	fl := flag.NewFlagSet("hearth-scripted-model", flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	listen := fl.String("listen", "127.0.0.1:8089", "")
	key := fl.String("key", DefaultKey, "")
	keyFile := fl.String("key-file", "", "")
	script := fl.String("script", "", "")
	printDemo := fl.Bool("print-demo", false, "")
	record := fl.String("record", "", "")
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			return 0
		}
		fmt.Fprintf(stderr, "hearth-scripted-model: %v\n\n%s", err, usage)
		return 2
	}
	if fl.NArg() > 0 {
		fmt.Fprintf(stderr, "hearth-scripted-model: unexpected argument %q\n\n%s", fl.Arg(0), usage)
		return 2
	}
	if *printDemo {
		b, _ := json.MarshalIndent(scriptedmodel.Demo(), "", "  ")
		fmt.Fprintf(stdout, "%s\n", b)
		return 0
	}
	cfg, err := load(*script, *key, *keyFile)
	if err == nil && *record != "" {
		if fi, serr := os.Stat(*record); serr != nil || !fi.IsDir() {
			err = fmt.Errorf("--record %s: not a directory; create it first", *record)
		}
	}
	if err == nil {
		err = serve(ctx, *listen, cfg, orDemo(*script), *record, stderr, ready)
	}
	if err != nil {
		fmt.Fprintf(stderr, "hearth-scripted-model: %v\n", err)
		return 1
	}
	return 0
}

// load makes the server's config: the script and the key.
func load(script, key, keyFile string) (scriptedmodel.Config, error) {
	var data []byte
	var err error
	if script != "" {
		data, err = os.ReadFile(script)
	} else {
		data, err = json.Marshal(scriptedmodel.Demo())
	}
	if err != nil {
		return scriptedmodel.Config{}, err
	}
	cfg, err := scriptedmodel.ParseScript(data)
	if err != nil {
		return cfg, fmt.Errorf("%s: %w", orDemo(script), err)
	}
	if keyFile != "" {
		b, err := os.ReadFile(keyFile)
		if err != nil {
			return cfg, fmt.Errorf("--key-file: %w", err)
		}
		key = strings.TrimSpace(string(b))
	}
	if key == "" {
		return cfg, errors.New("the key is empty")
	}
	cfg.Key, cfg.DiscardRequests = key, true
	return cfg, nil
}

func orDemo(script string) string {
	if script == "" {
		return "the demo script"
	}
	return script
}

// serve answers requests on addr until ctx is done, logging one line
// per request.
func serve(ctx context.Context, addr string, cfg scriptedmodel.Config, what, record string, stderr io.Writer, ready func(string)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	logger := log.New(stderr, "hearth-scripted-model: ", log.LstdFlags)
	var h http.Handler = scriptedmodel.New(cfg)
	if record != "" {
		h = recordRequests(h, record, logger)
	}
	srv := &http.Server{Handler: logRequests(h, logger), ReadHeaderTimeout: 10 * time.Second}
	logger.Printf("a scripted stand-in for the Anthropic, OpenAI and Gemini APIs (not a model) on http://%s, playing %s", ln.Addr(), what)
	if ready != nil {
		ready(ln.Addr().String())
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(shut)
	<-done
	return nil
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func logRequests(h http.Handler, logger *log.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		start := time.Now()
		defer func() {
			logger.Printf("%s %s: %d in %v", r.Method, r.URL.Path, rec.status, time.Since(start).Round(time.Millisecond))
		}()
		h.ServeHTTP(rec, r)
	})
}
