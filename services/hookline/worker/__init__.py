"""The inbox worker: claims leased events and applies each effect once."""
