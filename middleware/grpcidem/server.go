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
)

// ReplayedMetadata is the response header metadata key set to "true" on
// every replayed answer, a response or a final status.
const ReplayedMetadata = "idempotent-replayed"

// pushbackMetadata is the trailer by which a server tells grpc-go's retry
// policy how long to wait before the next attempt (gRFC A6).
const pushbackMetadata = "grpc-retry-pushback-ms"

// ErrorDomain is the Domain of the google.rpc.ErrorInfo detail that every
// answer of the interceptor itself carries. Its Reason is the outcome in
// upper case, as IN_PROGRESS; the package documentation lists them.
const ErrorDomain = "grpcidem.watermill-idempotency"

// retryable are the codes after which the key is FAILED, so that a retry
// runs the handler again: they say the call may not have had its effect, or
// may succeed later. CANCELED is among them: it is what a handler returns
// when its caller went away, which says nothing about the request.
var retryable = [...]codes.Code{
	codes.Unavailable, codes.Internal, codes.Unknown, codes.DeadlineExceeded,
	codes.ResourceExhausted, codes.Aborted, codes.Canceled,
}

// isRetryable reports whether a handler's status code leaves the key
// FAILED, so that a retry runs the handler again.
func isRetryable(c codes.Code) bool { return slices.Contains(retryable[:], c) }

// Middleware runs unary gRPC methods once per idempotency key. Build it
// with [New]; it is safe for concurrent use.
type Middleware struct {
	cfg      Config
	once     *idempotency.Once
	logger   watermill.LoggerAdapter
	maxSize  int  // the Once's MaxOutputSize: the largest answer stored
	failOpen bool // the Once's FailOpen
	scope    func(context.Context) string
	methods  map[string]bool
}

// New returns the interceptor for cfg on once, whose store, lease, TTLs,
// FailOpen, Observer, logger and MaxOutputSize it uses; share one Once
// with the other adapters of the process. New reports every problem at
// once, each matching [ErrInvalidConfig].
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
	if err := adapter.UsePrefix(once, c.KeyPrefix, true); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
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

// call is what the logs and the Observer say about one call.
type call struct {
	ctx      context.Context     // the call's, for the Observer (otelgrpc's span)
	method   string              // the full method name, the Observer's label
	key      string              // the stored key, once derived
	attempts int                 // the key's attempts, once claimed
	fields   watermill.LogFields // for the interceptor's own logs
}

// UnaryServerInterceptor is the grpc.UnaryServerInterceptor:
//
//	grpc.NewServer(grpc.ChainUnaryInterceptor(authenticate, idem.UnaryServerInterceptor))
//
// Calls of methods outside Config.Methods pass through untouched; streaming
// calls never reach it.
func (i *Middleware) UnaryServerInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !i.methods[info.FullMethod] {
		return handler(ctx, req)
	}
	c := call{ctx: ctx, method: info.FullMethod, fields: watermill.LogFields{"method": info.FullMethod}}
	msg, ok := req.(proto.Message)
	if !ok {
		i.logger.Error("Idempotency needs protocol buffers requests", fmt.Errorf("request is a %T", req), c.fields)
		return nil, i.refuse(idempotency.Outcome(adapter.NotProtoMessage),
			"The server cannot make this method idempotent: its request is not a protocol buffers message.", nil)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	key, source, err := extractKey(md, i.cfg.Metadata, msg, i.cfg.RequestField)
	switch {
	case err != nil:
		i.done(c, idempotency.OutcomeMissingKey, nil)
		return nil, i.refuse(idempotency.OutcomeMissingKey, i.describeKeyError(source, err), nil)
	case key == "" && i.cfg.KeyOptional:
		return handler(ctx, req)
	case key == "":
		i.done(c, idempotency.OutcomeMissingKey, nil)
		return nil, i.refuse(idempotency.OutcomeMissingKey, fmt.Sprintf(
			"%s requires an idempotency key: send a unique one (a V4 UUID, say) in the metadata %s or the request field %s, and reuse it when you retry.",
			info.FullMethod, i.cfg.Metadata[0], i.cfg.RequestField), nil)
	}
	fp, err := fingerprint(info.FullMethod, msg)
	if err != nil {
		i.logger.Error("Request cannot be fingerprinted", err, c.fields)
		return nil, i.refuse(idempotency.Outcome(adapter.NotProtoMessage), "The server cannot encode the request to fingerprint it.", nil)
	}
	skey := adapter.StoreKey(i.cfg.KeyPrefix, i.scope(ctx), key, true)
	c.fields["idempotency_key"] = skey // the scope's hash, never the scope
	c.key = skey

	lease, claim, err := i.once.Claim(adapter.WithLabel(ctx, info.FullMethod), skey, fp)
	c.attempts = claim.Record.Attempts
	switch {
	case err == nil && lease != nil:
		return i.run(ctx, req, handler, lease, c)
	case err == nil:
		return i.answerRepeat(ctx, claim.Record, fp, c)
	case errors.Is(err, idempotency.ErrTooManyAttempts):
		i.done(c, idempotency.OutcomeTooManyAttempts, err)
		return nil, i.refuse(idempotency.OutcomeTooManyAttempts,
			"The call with this idempotency key failed too many times, and will not run again with it. Use a new key.", nil)
	case errors.Is(err, idempotency.ErrCorruptRecord):
		i.done(c, idempotency.OutcomeCorruptRecord, err)
		return nil, i.refuse(idempotency.OutcomeCorruptRecord,
			"The idempotency record of this key cannot be read, so the call was not run. Retrying with the same key will not help until the server's operator repairs it.", nil)
	default:
		return i.claimFailed(ctx, req, handler, err, c)
	}
}

// claimFailed answers a call whose claim failed (ErrStoreUnavailable).
func (i *Middleware) claimFailed(ctx context.Context, req any, handler grpc.UnaryHandler, err error, c call) (any, error) {
	switch {
	case idempotency.OutcomeOf(err) == idempotency.OutcomeCallerGone:
		// The caller left during the claim: no sign of the store, and
		// nothing runs for it, even with FailOpen.
		i.done(c, idempotency.OutcomeCallerGone, err)
	case i.failOpen && ctx.Err() == nil:
		i.done(c, idempotency.OutcomeFailOpen, err)
		return handler(withForwardKey(ctx, i.cfg.KeyPrefix, c.key), req)
	default:
		i.done(c, idempotency.OutcomeStoreUnavailable, err)
	}
	return nil, i.refuse(idempotency.OutcomeStoreUnavailable,
		"The idempotency store cannot be reached, so the call was not run. Retry later with the same key.", nil)
}

// answerRepeat answers a call whose claim was refused, from the record that
// refused it.
func (i *Middleware) answerRepeat(ctx context.Context, rec idempotency.Record, fp []byte, c call) (any, error) {
	if len(rec.Fingerprint) > 0 && !slices.Equal(rec.Fingerprint, fp) {
		i.done(c, idempotency.OutcomeKeyReused, nil)
		return nil, i.refuse(idempotency.OutcomeKeyReused,
			"This idempotency key was first used for a different call (another method or request message). Use a new key for a new call.", nil)
	}
	if rec.State == idempotency.StateCompleted {
		return i.replay(ctx, rec.Result, c)
	}
	// IN_PROGRESS held by another call. (A FAILED record is claimed unless
	// its fingerprint differs, handled above; a store answering otherwise
	// is treated the same way: retry later.)
	i.done(c, idempotency.OutcomeInProgress, nil)
	_ = grpc.SetTrailer(ctx, metadata.Pairs(pushbackMetadata, strconv.FormatInt(i.cfg.RetryAfter.Milliseconds(), 10)))
	return nil, i.refuse(idempotency.OutcomeInProgress,
		"A call with this idempotency key is still running. Retry later with the same key.", nil)
}

// replay answers with a stored answer, with the header idempotent-replayed:
// true.
func (i *Middleware) replay(ctx context.Context, result []byte, c call) (any, error) {
	corrupt := func(err error) (any, error) {
		i.done(c, idempotency.OutcomeCorruptRecord, fmt.Errorf("stored answer of a completed key: %w", err))
		return nil, i.refuse(idempotency.OutcomeCorruptRecord,
			"The call with this key completed, but its stored answer cannot be read.", nil)
	}
	a, err := decodeAnswer(result)
	if err != nil {
		return corrupt(err)
	}
	switch a.Kind {
	case kindMessage:
		m, err := a.message(outputType(c.method))
		if err != nil {
			return corrupt(err)
		}
		i.done(c, idempotency.OutcomeDuplicate, nil)
		_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedMetadata, "true"))
		return m, nil
	case kindStatus:
		i.done(c, idempotency.OutcomeDuplicate, nil)
		_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedMetadata, "true"))
		return nil, status.FromProto(a.Status).Err()
	default: // kindOmitted
		i.done(c, idempotency.OutcomeDuplicate, nil)
		return nil, i.refuse(idempotency.OutcomeOutputNotStored, fmt.Sprintf(
			"The call with this key completed with %s, but its answer (%d bytes) was too large to store and cannot be replayed. Do not retry with a new key: look the result up instead.",
			a.Code, a.Size), map[string]string{"original_code": a.Code.String(), "size": strconv.Itoa(a.Size)})
	}
}

// run executes the handler as the key's owner, under the lease's context,
// then records the outcome: FAILED after a retryable code, a panic or a
// lost lease, COMPLETED with the answer otherwise, also when the caller
// left before the handler returned (its retry gets the replay).
func (i *Middleware) run(ctx context.Context, req any, handler grpc.UnaryHandler, lease *idempotency.Lease, c call) (any, error) {
	lctx := lease.Context()

	var (
		resp any
		herr error
	)
	adapter.RunHandler(lease, func(err error) { i.done(c, idempotency.OutcomeHandlerFailed, err) },
		func() { resp, herr = handler(withForwardKey(lctx, i.cfg.KeyPrefix, c.key), req) })

	if cause := context.Cause(lctx); errors.Is(cause, idempotency.ErrLeaseLost) {
		// Another call may have claimed the key and be running it: this
		// run's answer is not the key's outcome.
		lease.Fail()
		i.done(c, idempotency.OutcomeHandlerFailed, fmt.Errorf("handler answered after its lease was lost: %w", cause))
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
			lease.Fail()
			i.done(c, idempotency.OutcomeHandlerFailed, herr)
			return resp, herr
		}
		result, stored, err = encodeStatus(st, i.maxSize)
	} else {
		m, ok := resp.(proto.Message)
		if !ok {
			err = fmt.Errorf("response is a %T, not a protocol buffers message", resp)
		} else {
			result, stored, err = encodeResponse(m, i.maxSize)
		}
	}
	if err != nil {
		// An answer that cannot be stored cannot be replayed: let the
		// retry run again rather than replay something else.
		lease.Fail()
		i.done(c, idempotency.OutcomeHandlerFailed, fmt.Errorf("answer cannot be stored: %w", err))
		return resp, herr
	}
	if stored.Kind == kindOmitted {
		i.logger.Info("Answer too large to store; repeats will be answered ALREADY_EXISTS", c.fields.Copy().Add(watermill.LogFields{
			"code": stored.Code.String(), "size": stored.Size, "max_output_size": i.maxSize,
		}))
	}
	cerr := lease.Complete(result)
	i.done(c, idempotency.OutcomeOf(cerr), cerr)
	return resp, herr
}

// outputType returns the output type of the method fullMethod as the
// protobuf registry knows it, or "" when it does not.
func outputType(fullMethod string) protoreflect.FullName {
	md, _ := lookupMethod(fullMethod)
	if md == nil {
		return ""
	}
	return md.Output().FullName()
}

// lookupMethod returns the descriptor of the method fullMethod from the
// protobuf registry (protoregistry.GlobalFiles, where generated code
// registers its files), and whether the registry knows its service: a
// known service without the method returns nil and true.
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

// refuse builds one of the interceptor's own answers, from the adapters'
// one table (adapter.Refusals): the outcome's code, msg, an ErrorInfo with
// the outcome as reason (and meta), and a RetryInfo when retrying with the
// same key can help.
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

// describeKeyError says what is wrong with the key from source, for a
// status message.
func (i *Middleware) describeKeyError(source string, err error) string {
	msg := fmt.Sprintf("The idempotency key in %s %v", source, err)
	switch {
	case errors.Is(err, adapter.ErrKeyNotPrintable):
		msg += " (0x20 to 0x7E only)"
	}
	return msg + ": send one valid key per call."
}

// done counts and logs one outcome, through the Once.
func (i *Middleware) done(c call, outcome idempotency.Outcome, err error) {
	i.once.Report(c.ctx, idempotency.OutcomeDetails{Handler: c.method, Key: c.key, Outcome: outcome, Attempt: c.attempts, Err: err})
}
