"""Shared tuning machinery: the persistent tuning database and candidate timing. Knows no op."""
