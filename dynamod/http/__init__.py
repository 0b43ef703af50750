"""What every HTTP surface shares: serving an app, the OpenAI wire format, and counting
requests in flight for a drain. The worker and the daemon's front both build on it; it
imports neither."""
