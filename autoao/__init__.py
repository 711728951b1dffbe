"""autoao."""
