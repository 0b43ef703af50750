"""dynamoctl: the operator CLI for dynamod."""
