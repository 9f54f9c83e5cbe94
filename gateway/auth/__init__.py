"""Who a connection is and what it may do: identities, the access policy, quotas."""
