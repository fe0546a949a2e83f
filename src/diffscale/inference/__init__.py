"""A trained run used: loaded back from its checkpoint, sampled, evaluated and exported
(with its model card)."""
