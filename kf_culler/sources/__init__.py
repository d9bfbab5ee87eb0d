"""One adapter per signal source. Adapters only gather: every failure becomes `{"error": ...}`."""
