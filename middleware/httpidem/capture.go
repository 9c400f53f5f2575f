package httpidem

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// errHijackUnsupported: a hijacked response cannot be recorded or replayed.
var errHijackUnsupported = errors.New("httpidem: hijacking is not supported under the idempotency middleware")

// recorder passes the handler's response on while keeping its status, its
// headers and up to max bytes of its body. After a write to the client
// fails, the rest is kept, not sent, and the handler's writes succeed. A
// write refused for what the handler wrote (a body its status forbids, or
// past its Content-Length) fails for the handler, as without the middleware.
type recorder struct {
	http.ResponseWriter
	outer http.Header // set by outer middleware: neither stored nor replayed
	max   int

	status int // 0 until the header is written
	header http.Header
	body   bytes.Buffer
	size   int64
	over   bool
	broken bool  // a write to the client failed
	length int64 // the Content-Length the handler set, or -1
}

func newRecorder(w http.ResponseWriter, max int) *recorder {
	return &recorder{ResponseWriter: w, outer: w.Header().Clone(), max: max, length: -1}
}

// WriteHeader implements http.ResponseWriter.
func (r *recorder) WriteHeader(code int) {
	// Informational answers (103 Early Hints) precede the real one.
	if r.status == 0 && code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		r.ResponseWriter.WriteHeader(code)
		return
	}
	if r.status == 0 {
		r.status = code
		r.header = handlerHeader(r.ResponseWriter.Header(), r.outer)
		if n, err := strconv.ParseInt(r.ResponseWriter.Header().Get("Content-Length"), 10, 64); err == nil && n >= 0 {
			r.length = n
		}
	}
	r.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		// Sniff the type into the header, so that the replay carries it too.
		if _, set := r.ResponseWriter.Header()["Content-Type"]; !set && len(p) > 0 {
			r.ResponseWriter.Header().Set("Content-Type", http.DetectContentType(p))
		}
		r.WriteHeader(http.StatusOK)
	}
	if !r.broken {
		n, err := r.ResponseWriter.Write(p)
		overLength := r.length >= 0 && r.size+int64(len(p)) > r.length // HTTP/2 has its own error for it
		if err != nil && (overLength || errors.Is(err, http.ErrBodyNotAllowed) || errors.Is(err, http.ErrContentLength)) {
			// Refused for what the handler wrote: the handler's error.
			r.keep(p[:n])
			return n, err
		}
		r.broken = err != nil
	}
	r.keep(p)
	return len(p), nil
}

func (r *recorder) keep(p []byte) {
	r.size += int64(len(p))
	if r.over {
		return
	}
	if r.body.Len()+len(p) > r.max {
		r.over = true
		r.body = bytes.Buffer{}
		return
	}
	r.body.Write(p)
}

// Flush implements http.Flusher when the underlying writer can flush.
func (r *recorder) Flush() {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if !r.broken {
		_ = http.NewResponseController(r.ResponseWriter).Flush()
	}
}

// Hijack refuses: http.ResponseController finds it before Unwrap.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, errHijackUnsupported
}

// Unwrap lets http.ResponseController reach deadlines and full duplex.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// response returns what a repeat will be answered with.
func (r *recorder) response() storedResponse {
	status, header := r.status, r.header
	if status == 0 { // the handler wrote nothing: net/http answers 200
		status, header = http.StatusOK, handlerHeader(r.ResponseWriter.Header(), r.outer)
	}
	s := storedResponse{Status: status, Header: header, BodySize: r.size, BodyOmitted: r.over}
	if !r.over {
		s.Body = r.body.Bytes()
	}
	return s
}

// handlerHeader returns the headers of h that the handler set, less the
// hop-by-hop ones and trailers. A name set to nil is kept as such.
func handlerHeader(h, outer http.Header) http.Header {
	out := make(http.Header, len(h))
	for name, values := range h {
		ov, isOuter := outer[name]
		if isOuter && slices.Equal(ov, values) || hopByHop[name] || strings.HasPrefix(name, http.TrailerPrefix) {
			continue
		}
		out[name] = slices.Clone(values)
	}
	return out
}

var hopByHop = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true,
	"Transfer-Encoding": true, "Upgrade": true, "Te": true, "Trailer": true}
