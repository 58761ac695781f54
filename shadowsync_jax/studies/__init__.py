"""Studies built on `train.train_and_evaluate`: sweeps, the CPR and GBA studies, the shadow thread's cost, reference
predictors, and the result files they write. Above the library: nothing in it imports this package."""
