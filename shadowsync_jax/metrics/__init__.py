"""What a run reports: CTR metrics (NE, AUC), the evaluation of the consensus model, the metric stream and the summary,
the progress line."""
