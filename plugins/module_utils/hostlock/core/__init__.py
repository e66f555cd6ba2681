"""Model, rules and errors: leaf modules every other part imports and that import nothing outside core."""
