"""Capacity, flavors and quotas (issue: capacity, flavors and quotas). Models arrive with that work."""
