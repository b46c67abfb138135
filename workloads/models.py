"""Service templates and requests (issue: the request lifecycle). Models arrive with that work."""
