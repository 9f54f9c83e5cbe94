"""What the protocol listeners share: the listener and session bases, accepting and
listening, idle connections, in-flight requests and their budgets, TLS, and the look-up of
topics a produce under an access policy must do first."""
