"""Pure domain types: ids, states, entities, change-URI grammar, the error tree."""
