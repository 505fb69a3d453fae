package auth

import "context"

type operatorKey struct{}

// WithOperator returns ctx carrying op, the human a request was
// authenticated as by other means than a bearer token (a dashboard login
// session). The API's mutating routes accept it like an operator token.
func WithOperator(ctx context.Context, op Operator) context.Context {
	return context.WithValue(ctx, operatorKey{}, op)
}

// OperatorFrom returns the operator WithOperator put in ctx.
func OperatorFrom(ctx context.Context) (Operator, bool) {
	op, ok := ctx.Value(operatorKey{}).(Operator)
	return op, ok && op.Name != ""
}
