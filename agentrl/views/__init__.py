"""Reading runs back: the doctor, replay, the HTML viewer, and finding a run's tokenizer."""
