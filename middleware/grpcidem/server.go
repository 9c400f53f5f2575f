package grpcidem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter/serve"
)

// ReplayedMetadata is the header metadata key set to "true" on every
// replayed answer.
const ReplayedMetadata = "idempotent-replayed"

// pushbackMetadata tells grpc-go's retry policy how long to wait (gRFC A6).
const pushbackMetadata = "grpc-retry-pushback-ms"

// ErrorDomain is the Domain of the google.rpc.ErrorInfo that every answer
// of the interceptor itself carries.
const ErrorDomain = "grpcidem.watermill-idempotency"

// retryable are the codes after which the key is FAILED: the call may not
// have had its effect. CANCELED says its caller left, nothing of the request.
var retryable = [...]codes.Code{
	codes.Unavailable, codes.Internal, codes.Unknown, codes.DeadlineExceeded,
	codes.ResourceExhausted, codes.Aborted, codes.Canceled,
}

func isRetryable(c codes.Code) bool { return slices.Contains(retryable[:], c) }

// Middleware runs unary gRPC methods once per idempotency key. Build it
// with [New]; it is safe for concurrent use.
type Middleware struct {
	cfg      Config
	once     *idempotency.Once
	logger   watermill.LoggerAdapter
	maxSize  int // the Once's MaxOutputSize
	failOpen bool
	scope    func(context.Context) string
	methods  map[string]bool
}

// New returns the interceptor for cfg on once, which holds the store and
// the settings shared with the process's other adapters. New reports every
// problem at once, each matching [ErrInvalidConfig].
func New(once *idempotency.Once, cfg *Config) (*Middleware, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	c, err := cfg.withDefaults()
	if once == nil {
		err = errors.Join(fmt.Errorf("%w: the Once is nil", ErrInvalidConfig), err)
	}
	if err != nil {
		return nil, err
	}
	oc := once.Config()
	i := &Middleware{cfg: c, once: once, logger: oc.Logger, maxSize: oc.MaxOutputSize, failOpen: oc.FailOpen,
		scope: c.Scope, methods: make(map[string]bool, len(c.Methods))}
	for _, m := range c.Methods {
		i.methods[m] = true
	}
	if c.SingleTenant {
		i.scope = func(context.Context) string { return "" }
	}
	return i, nil
}

// messages are the status messages of the refusals after a claim.
var messages = map[idempotency.Outcome]string{
	idempotency.OutcomeTooManyAttempts:  "The call with this idempotency key failed too many times, and will not run again with it. Use a new key.",
	idempotency.OutcomeCorruptRecord:    "The idempotency record of this key cannot be read, so the call was not run. Retrying with the same key will not help until the server's operator repairs it.",
	idempotency.OutcomeStoreUnavailable: "The idempotency store cannot be reached, so the call was not run. Retry later with the same key.",
	idempotency.OutcomeKeyReused:        "This idempotency key was first used for a different call (another method or request message). Use a new key for a new call.",
	idempotency.OutcomeInProgress:       "A call with this idempotency key is still running. Retry later with the same key.",
}

// UnaryServerInterceptor is the grpc.UnaryServerInterceptor. Calls of
// methods outside Config.Methods pass through untouched.
func (i *Middleware) UnaryServerInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !i.methods[info.FullMethod] {
		return handler(ctx, req)
	}
	c := &serve.Request{Once: i.once, FailOpen: i.failOpen, Ctx: ctx, Label: info.FullMethod}
	fields := watermill.LogFields{"method": info.FullMethod}
	msg, ok := req.(proto.Message)
	if !ok {
		i.logger.Error("Idempotency needs protocol buffers requests", fmt.Errorf("request is a %T", req), fields)
		return nil, i.refuse(idempotency.Outcome(adapter.NotProtoMessage),
			"The server cannot make this method idempotent: its request is not a protocol buffers message.", nil)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	key, source, err := extractKey(md, i.cfg.Metadata, msg, defaultRequestField)
	switch {
	case err != nil:
		c.Done(idempotency.OutcomeMissingKey, nil)
		return nil, i.refuse(idempotency.OutcomeMissingKey, i.describeKeyError(source, err), nil)
	case key == "" && i.cfg.KeyOptional:
		return handler(ctx, req)
	case key == "":
		c.Done(idempotency.OutcomeMissingKey, nil)
		return nil, i.refuse(idempotency.OutcomeMissingKey, fmt.Sprintf(
			"%s requires an idempotency key: send a unique one (a V4 UUID, say) in the metadata %s or the request field %s, and reuse it when you retry.",
			info.FullMethod, i.cfg.Metadata[0], defaultRequestField), nil)
	}
	fp, err := fingerprint(info.FullMethod, msg)
	if err != nil {
		i.logger.Error("Request cannot be fingerprinted", err, fields)
		return nil, i.refuse(idempotency.Outcome(adapter.NotProtoMessage), "The server cannot encode the request to fingerprint it.", nil)
	}
	c.Key = adapter.StoreKey(i.cfg.KeyPrefix, i.scope(ctx), key, true)
	fields["idempotency_key"] = c.Key

	lease, rec, outcome := c.Claim(fp)
	switch outcome {
	case "":
		return i.run(req, handler, lease, c, fields)
	case idempotency.OutcomeDuplicate:
		return i.replay(ctx, rec.Result, c)
	case idempotency.OutcomeFailOpen:
		return handler(serve.WithForwardKey(ctx, i.cfg.KeyPrefix, c.Key), req)
	case idempotency.OutcomeInProgress:
		_ = grpc.SetTrailer(ctx, metadata.Pairs(pushbackMetadata, strconv.FormatInt(i.cfg.RetryAfter.Milliseconds(), 10)))
	}
	return nil, i.refuse(outcome, messages[outcome], nil)
}

// replay answers with a stored answer, with the header idempotent-replayed.
func (i *Middleware) replay(ctx context.Context, result []byte, c *serve.Request) (any, error) {
	corrupt := func(err error) (any, error) {
		c.Done(idempotency.OutcomeCorruptRecord, fmt.Errorf("stored answer of a completed key: %w", err))
		return nil, i.refuse(idempotency.OutcomeCorruptRecord,
			"The call with this key completed, but its stored answer cannot be read.", nil)
	}
	a, err := decodeAnswer(result)
	if err != nil {
		return corrupt(err)
	}
	switch a.Kind {
	case kindMessage:
		m, err := a.message(outputType(c.Label))
		if err != nil {
			return corrupt(err)
		}
		c.Done(idempotency.OutcomeDuplicate, nil)
		_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedMetadata, "true"))
		return m, nil
	case kindStatus:
		c.Done(idempotency.OutcomeDuplicate, nil)
		_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedMetadata, "true"))
		return nil, status.FromProto(a.Status).Err()
	default: // kindOmitted
		c.Done(idempotency.OutcomeDuplicate, nil)
		return nil, i.refuse(idempotency.OutcomeOutputNotStored, fmt.Sprintf(
			"The call with this key completed with %s, but its answer (%d bytes) was too large to store and cannot be replayed. Do not retry with a new key: look the result up instead.",
			a.Code, a.Size), map[string]string{"original_code": a.Code.String(), "size": strconv.Itoa(a.Size)})
	}
}

// run executes the handler as the key's owner, then records FAILED after a
// retryable code, else COMPLETED with the answer, also when the caller left.
func (i *Middleware) run(req any, handler grpc.UnaryHandler, lease *idempotency.Lease, c *serve.Request, fields watermill.LogFields) (any, error) {
	var (
		resp any
		herr error
	)
	if !c.Run(lease, func(ctx context.Context) string {
		resp, herr = handler(serve.WithForwardKey(ctx, i.cfg.KeyPrefix, c.Key), req)
		return ""
	}) {
		return resp, herr
	}
	var (
		result []byte
		stored storedAnswer
		err    error
	)
	if herr != nil {
		st := status.Convert(herr)
		if isRetryable(st.Code()) {
			c.Fail(lease, herr)
			return resp, herr
		}
		result, stored, err = encodeStatus(st, i.maxSize)
	} else if m, ok := resp.(proto.Message); ok {
		result, stored, err = encodeResponse(m, i.maxSize)
	} else {
		err = fmt.Errorf("response is a %T, not a protocol buffers message", resp)
	}
	if err != nil {
		// An answer that cannot be stored cannot be replayed: the retry runs.
		c.Fail(lease, fmt.Errorf("answer cannot be stored: %w", err))
		return resp, herr
	}
	if stored.Kind == kindOmitted {
		i.logger.Info("Answer too large to store; repeats will be answered ALREADY_EXISTS", fields.Add(watermill.LogFields{
			"code": stored.Code.String(), "size": stored.Size, "max_output_size": i.maxSize,
		}))
	}
	cerr := lease.Complete(result)
	c.Done(idempotency.OutcomeOf(cerr), cerr)
	return resp, herr
}

// outputType returns the output type of fullMethod, or "" when the
// protobuf registry does not know it.
func outputType(fullMethod string) protoreflect.FullName {
	md, _ := lookupMethod(fullMethod)
	if md == nil {
		return ""
	}
	return md.Output().FullName()
}

// lookupMethod returns the descriptor of fullMethod from
// protoregistry.GlobalFiles, and whether the registry knows its service.
func lookupMethod(fullMethod string) (protoreflect.MethodDescriptor, bool) {
	service, method, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok {
		return nil, false
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		return nil, false
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, false
	}
	return sd.Methods().ByName(protoreflect.Name(method)), true
}

// refuse builds one of the interceptor's own answers, from adapter.Refusals:
// the code, msg, an ErrorInfo with meta, and a RetryInfo when a retry helps.
func (i *Middleware) refuse(outcome idempotency.Outcome, msg string, meta map[string]string) error {
	r := adapter.Refusals[string(outcome)]
	code := codes.Code(r.GRPC)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: adapter.Reason(string(outcome)), Domain: ErrorDomain, Metadata: meta}}
	if r.Retry {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(i.cfg.RetryAfter)})
	}
	st, err := status.New(code, msg).WithDetails(details...)
	if err != nil { // only for OK, never in the table
		return status.Error(code, msg)
	}
	return st.Err()
}

// describeKeyError says what is wrong with the key from source.
func (i *Middleware) describeKeyError(source string, err error) string {
	msg := fmt.Sprintf("The idempotency key in %s %v", source, err)
	switch {
	case errors.Is(err, adapter.ErrKeyNotPrintable):
		msg += " (0x20 to 0x7E only)"
	}
	return msg + ": send one valid key per call."
}
