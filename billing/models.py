"""Prices, usage intervals and statements. Models arrive with the billing work."""
