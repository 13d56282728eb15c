"""τ²-airline: a stateful tool-agent environment over the τ²-bench airline domain (Appendix G)."""
