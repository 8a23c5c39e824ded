// `hpc_train evaluate`: trained weights on a split of a dataset, as training's evaluation
// measures them (Evaluator: every sample once over any number of ranks), with everything an
// evaluation can say: loss, top-1, top-5 and per-class accuracy, the confusion matrix and every
// sample's prediction. Reads as a table of contents:
//   config    -> the command's options                          (evaluate_config.h)
//   runtime   -> MPI, threads, placement, agreed as training's   (runtime.h, placement.h)
//   data      -> the dataset opened and validated                 (dataset_file.h)
//   weights   -> a checkpoint (its model_state) or a safetensors file into the model it records
//                                                                 (training_state.h, initial_weights.h)
//   evaluate  -> the sums and the predictions                     (evaluation.h)
//   results   -> rank 0 writes them into --out
//
// Results, in --out (rank 0 writes them, each file whole or not at all):
//   evaluation.json       the figures: loss, accuracy, correct, samples, top5_accuracy and
//                         correct_top5 (null below 5 classes), class_accuracy, class_samples,
//                         class_names, the confusion matrix (rows: labels), and what was evaluated
//   confusion_matrix.csv  one row per label, one column per predicted class (counts)
//   predictions.csv       index,label,predicted,class_1..class_k,probability_1..probability_k:
//                         each sample of the split in order, its top-1 class (argmax, as the
//                         accuracy counts it) and its k = min(5, classes) most likely classes
//                         with their softmax probabilities (fp32, most likely first)
// `hpc_train_report DIR` draws confusion_matrix.png from evaluation.json.
#pragma once

namespace hpc_train {

// The whole command: argv as main has it, argv[1] == kEvaluateCommand. Errors end every rank with
// a message and a code as training's do (usage 2, data 3: a missing or foreign weights file,
// weights of another model or input, a bad dataset). Returns the exit code, MPI finalized.
int run_evaluate_command(int argc, char** argv);

}  // namespace hpc_train
