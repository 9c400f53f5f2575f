package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/idempotency/watermill-idempotency/middleware/httpidem"
)

func main() {
	api := cmp.Or(os.Getenv("API_URL"), "http://127.0.0.1:8080")
	apiKey := cmp.Or(os.Getenv("API_KEY"), "sk_test_client")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, api, apiKey, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		fmt.Fprintln(os.Stderr, "client: is the API running? go run ./examples/http")
		os.Exit(1)
	}
}

type payment struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Status   string `json:"status"`
}

// run pays 10.00 EUR through a link that loses the first answer, pays again
// with the key the first call used, reads the payment back, and prints
// what happened to out.
func run(ctx context.Context, api, apiKey string, out io.Writer) error {
	target, err := url.Parse(api)
	if err != nil {
		return err
	}
	link, err := startFlakyLink(target.Host)
	if err != nil {
		return err
	}
	defer link.Close()
	viaLink := *target
	viaLink.Host = link.Addr()

	// The Transport sends every attempt through its Base: here, one that
	// prints what came back.
	client := &http.Client{Transport: &httpidem.Transport{Base: printer{out, http.DefaultTransport}}}
	defer client.CloseIdleConnections()

	// The first call: the Transport gives it a key and keeps it across
	// its retries.
	first, resp, err := pay(ctx, client, viaLink.String(), apiKey)
	if err != nil {
		return err
	}
	key := resp.Request.Header.Get("Idempotency-Key") // the key the call used
	fmt.Fprintf(out, "paid %s: %d %s, key %s\n", first.ID, first.Amount, first.Currency, key)

	// The application pays again with the key it kept (it crashed before
	// it recorded the payment, say): the API answers with the same payment.
	again, _, err := pay(httpidem.WithKey(ctx, key), client, viaLink.String(), apiKey)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "paid again with the same key: %s\n", again.ID)

	var stored payment
	if _, err := call(ctx, client, http.MethodGet, viaLink.String()+"/payments/"+first.ID, apiKey, "", &stored); err != nil {
		return err
	}
	fmt.Fprintf(out, "one payment: %s %d %s %s\n", stored.ID, stored.Amount, stored.Currency, stored.Status)
	if again.ID != first.ID {
		return errors.New("two payments for one key")
	}
	return nil
}

func pay(ctx context.Context, client *http.Client, api, apiKey string) (payment, *http.Response, error) {
	var p payment
	resp, err := call(ctx, client, http.MethodPost, api+"/payments", apiKey, `{"amount":1000,"currency":"eur"}`, &p)
	return p, resp, err
}

// call sends one request and decodes its JSON answer into v; an answer
// other than 2xx is an error.
func call(ctx context.Context, client *http.Client, method, url, apiKey, body string, v any) (*http.Response, error) {
	// strings.NewReader gives the request a GetBody, so that the
	// Transport can send the body again.
	req, err := http.NewRequestWithContext(context.WithValue(ctx, attemptsKey{}, new(int)), method, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s %s: %s: %s", method, req.URL.Path, resp.Status, raw)
	}
	return resp, json.Unmarshal(raw, v)
}

// attemptsKey is the context key of a call's attempt count.
type attemptsKey struct{}

// printer is a RoundTripper that prints each attempt: what came back.
type printer struct {
	out  io.Writer
	base http.RoundTripper
}

func (p printer) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := p.base.RoundTrip(r)
	n, _ := r.Context().Value(attemptsKey{}).(*int)
	if n == nil {
		n = new(int)
	}
	*n++
	what := "no answer (the connection broke)"
	if err == nil {
		what = fmt.Sprintf("%d %s", resp.StatusCode, http.StatusText(resp.StatusCode))
		if resp.Header.Get("Idempotent-Replayed") == "true" {
			what += ", Idempotent-Replayed: true"
		}
	}
	fmt.Fprintf(p.out, "%s %s, attempt %d: %s\n", r.Method, r.URL.Path, *n, what)
	return resp, err
}
