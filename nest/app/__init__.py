"""The application: the Hydra CLI, config composition, Hugging Face configs, results, summaries,
validation against measured runs."""
