"""Built-in components, registered through the same plugin manager as external plugins."""
