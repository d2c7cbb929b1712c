"""Followers: one module per kind (Redis, search, Delta, views) behind one Sink interface that
applies a folded batch with the version gate. Not implemented yet: issues #5 and #6.
"""
