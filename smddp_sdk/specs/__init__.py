"""Typed job descriptions and the /opt/ml contract: standard library only, shared by client and runtime."""
