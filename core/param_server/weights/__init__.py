"""Versioned weights: the store, arriving parts, served versions, weights on disk, a store split by tensor."""
