"""The fallback gateway (issue 7): configuration and state today; the server comes next."""
