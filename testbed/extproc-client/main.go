// Command extproc-client plays a gateway's data plane (Envoy's ext_proc filter) against an endpoint
// picker: for each request it opens one envoy.service.ext_proc.v3.ExternalProcessor/Process stream, as
// Envoy does per HTTP request, sends the request headers and an OpenAI JSON body in the processing mode
// the Gateway API Inference Extension's picker expects (request body FULL_DUPLEX_STREAMED), and reads
// the picker's answer: the endpoint it picked (the x-gateway-destination-endpoint header mutation and
// the envoy.lb dynamic metadata) or an immediate response with its HTTP status (503 when the pool has no
// endpoint). With -forward it then sends the request to the picked endpoint, as Envoy's original-destination
// cluster would, and streams the engine's response headers and body back to the picker, so the picker
// sees the whole request lifecycle.
//
// It prints one JSON object a line per request and exits 1 if any stream failed at the gRPC level.
// The specfleet cluster tier runs it inside the test's network namespace (see testbed/README.md).
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"
)

// result is one output line. Exactly one of Endpoint (a pick), ImmediateStatus or Error is set.
type result struct {
	Index            int    `json:"index"`
	Endpoint         string `json:"endpoint,omitempty"`         // the destination header the picker set
	MetadataEndpoint string `json:"metadataEndpoint,omitempty"` // the same pick as envoy.lb dynamic metadata
	ImmediateStatus  int    `json:"immediateStatus,omitempty"`  // the HTTP status of an immediate response
	UpstreamStatus   int    `json:"upstreamStatus,omitempty"`   // with -forward: the engine's HTTP status
	Error            string `json:"error,omitempty"`
	Millis           int64  `json:"millis"`
}

type options struct {
	addr     string
	useTLS   bool
	requests int
	interval time.Duration
	timeout  time.Duration
	path     string
	model    string
	prompt   string
	headers  headerFlags
	forward  bool
}

// headerFlags collects repeated -header NAME=VALUE flags (an objective header, say).
type headerFlags [][2]string

func (h *headerFlags) String() string { return fmt.Sprint(*h) }

func (h *headerFlags) Set(value string) error {
	name, val, ok := strings.Cut(value, "=")
	if !ok || name == "" {
		return fmt.Errorf("want NAME=VALUE, got %q", value)
	}
	*h = append(*h, [2]string{strings.ToLower(name), val})
	return nil
}

func main() {
	var opts options
	flag.StringVar(&opts.addr, "addr", "127.0.0.1:9002", "the picker's ext_proc gRPC address")
	// The picker serves TLS with a self-signed certificate unless --secure-serving=false; gateways
	// connect to it without verifying it (the InferencePool names a Service, not a CA).
	flag.BoolVar(&opts.useTLS, "tls", true, "TLS without certificate verification, as gateways dial the picker")
	flag.IntVar(&opts.requests, "requests", 1, "how many requests, one stream each")
	flag.DurationVar(&opts.interval, "interval", 0, "pause between requests")
	flag.DurationVar(&opts.timeout, "timeout", 10*time.Second, "per-request deadline")
	flag.StringVar(&opts.path, "path", "/v1/completions", "the HTTP request's :path")
	flag.StringVar(&opts.model, "model", "", "the body's model (required)")
	flag.StringVar(&opts.prompt, "prompt", "Say hello.", "the body's prompt")
	flag.Var(&opts.headers, "header", "an extra request header NAME=VALUE (repeatable)")
	flag.BoolVar(&opts.forward, "forward", false, "send each picked request to the endpoint and relay the response to the picker")
	flag.Parse()
	if opts.model == "" || opts.requests < 1 {
		fmt.Fprintln(os.Stderr, "extproc-client: -model is required and -requests must be at least 1")
		os.Exit(2)
	}
	os.Exit(run(opts))
}

func run(opts options) int {
	creds := insecure.NewCredentials()
	if opts.useTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // as gateways dial the picker
	}
	conn, err := grpc.NewClient(opts.addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		fmt.Fprintf(os.Stderr, "extproc-client: %v\n", err)
		return 1
	}
	defer conn.Close()
	client := extprocv3.NewExternalProcessorClient(conn)
	out := json.NewEncoder(os.Stdout)
	failed := false
	for i := range opts.requests {
		if i > 0 && opts.interval > 0 {
			time.Sleep(opts.interval)
		}
		start := time.Now()
		res := processOne(client, opts, i)
		res.Index, res.Millis = i, time.Since(start).Milliseconds()
		failed = failed || res.Error != ""
		if err := out.Encode(res); err != nil {
			fmt.Fprintf(os.Stderr, "extproc-client: %v\n", err)
			return 1
		}
	}
	if failed {
		return 1
	}
	return 0
}

func header(name, value string) *corev3.HeaderValue {
	// Envoy sends header values as raw_value bytes.
	return &corev3.HeaderValue{Key: name, RawValue: []byte(value)}
}

// processOne plays one HTTP request through the picker on a stream of its own.
func processOne(client extprocv3.ExternalProcessorClient, opts options, index int) result {
	ctx, cancel := context.WithTimeout(context.Background(), opts.timeout)
	defer cancel()
	stream, err := client.Process(ctx)
	if err != nil {
		return result{Error: fmt.Sprintf("open stream: %v", err)}
	}
	body, err := json.Marshal(map[string]any{"model": opts.model, "prompt": opts.prompt, "max_tokens": 8})
	if err != nil {
		return result{Error: err.Error()}
	}
	headers := []*corev3.HeaderValue{
		header(":method", "POST"),
		header(":path", opts.path),
		header(":authority", "inference-gateway"),
		header(":scheme", "http"),
		header("content-type", "application/json"),
		header("content-length", strconv.Itoa(len(body))),
		header("x-request-id", fmt.Sprintf("extproc-client-%d-%d", os.Getpid(), index)),
	}
	for _, h := range opts.headers {
		headers = append(headers, header(h[0], h[1]))
	}
	// What Envoy sends with the Inference Extension's filter configuration: headers first (the body
	// follows, so not end of stream), the protocol configuration on the first message, then the body.
	first := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: headers}, EndOfStream: false,
		}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		},
	}
	bodyMsg := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}},
	}
	for _, msg := range []*extprocv3.ProcessingRequest{first, bodyMsg} {
		if err := stream.Send(msg); err != nil {
			return result{Error: fmt.Sprintf("send request: %v", err)}
		}
	}

	var res result
	var mutatedBody []byte
	for bodyDone := false; !bodyDone; {
		resp, err := stream.Recv()
		if err != nil {
			return result{Error: fmt.Sprintf("receive: %v", err)}
		}
		switch r := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			res.ImmediateStatus = int(r.ImmediateResponse.GetStatus().GetCode())
			_ = stream.CloseSend()
			return res
		case *extprocv3.ProcessingResponse_RequestHeaders:
			for _, set := range r.RequestHeaders.GetResponse().GetHeaderMutation().GetSetHeaders() {
				if strings.EqualFold(set.GetHeader().GetKey(), metadata.DestinationEndpointKey) {
					res.Endpoint = headerValue(set.GetHeader())
				}
			}
			res.MetadataEndpoint = metadataEndpoint(resp.GetDynamicMetadata())
		case *extprocv3.ProcessingResponse_RequestBody:
			streamed := r.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			mutatedBody = append(mutatedBody, streamed.GetBody()...)
			bodyDone = streamed.GetEndOfStream()
		default:
			return result{Error: fmt.Sprintf("unexpected response before the request body's end: %T", r)}
		}
	}
	if res.Endpoint == "" {
		res.Error = "the picker answered without a destination endpoint"
		return res
	}
	if opts.forward {
		if err := forward(ctx, stream, opts.path, res.Endpoint, mutatedBody, &res); err != nil {
			res.Error = err.Error()
			return res
		}
	}
	if err := stream.CloseSend(); err != nil {
		res.Error = fmt.Sprintf("close: %v", err)
	}
	return res
}

func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

// metadataEndpoint is envoy.lb's x-gateway-destination-endpoint, where Envoy's load balancer reads it.
func metadataEndpoint(md *structpb.Struct) string {
	lb := md.GetFields()[metadata.DestinationEndpointNamespace].GetStructValue()
	return lb.GetFields()[metadata.DestinationEndpointKey].GetStringValue()
}

// forward sends the (possibly mutated) body to the picked endpoint and relays the response to the
// picker the way Envoy does in FULL_DUPLEX_STREAMED mode: response headers, then the body with end of stream.
func forward(
	ctx context.Context, stream extprocv3.ExternalProcessor_ProcessClient, path, endpoint string, body []byte, res *result,
) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+endpoint+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("content-type", "application/json")
	upstream, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("upstream %s: %w", endpoint, err)
	}
	respBody, err := io.ReadAll(upstream.Body)
	_ = upstream.Body.Close()
	if err != nil {
		return fmt.Errorf("upstream %s body: %w", endpoint, err)
	}
	res.UpstreamStatus = upstream.StatusCode
	respHeaders := []*corev3.HeaderValue{
		header(":status", strconv.Itoa(upstream.StatusCode)),
		header("content-type", upstream.Header.Get("content-type")),
	}
	msgs := []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: respHeaders},
		}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: respBody, EndOfStream: true,
		}}},
	}
	for _, msg := range msgs {
		if err := stream.Send(msg); err != nil {
			return fmt.Errorf("send response: %w", err)
		}
	}
	for headersSeen := false; ; {
		resp, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("receive response processing: %w", err)
		}
		switch r := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_ResponseHeaders:
			headersSeen = true
		case *extprocv3.ProcessingResponse_ResponseBody:
			if r.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
				if !headersSeen {
					return errors.New("response body processed before its headers")
				}
				return nil
			}
		default:
			return fmt.Errorf("unexpected response while relaying the upstream response: %T", r)
		}
	}
}
