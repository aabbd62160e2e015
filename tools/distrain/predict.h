/* distrain predict: a model's predictions on images, one JSON line per example. */
#ifndef DISTRAIN_PREDICT_H
#define DISTRAIN_PREDICT_H

/* Runs "distrain predict ..." (argv[0] is "predict"). Returns the exit code: 0, 1 (a model,
 * weights or data error), 2 (usage). */
int distrain_predict_main(int argc, char **argv);

#endif
