"""Tables of the world, each entry with its source: model shapes and device peaks."""
