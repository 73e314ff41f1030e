// Between a rank's part of the model and the one-rank model's tensors (DESIGN.md invariant
// 6: checkpoints are the one-rank model's, so a run saved at one layout loads at another).
// Both sides are ParameterSets whose tensors share names; the rank's ParamInfo says where
// its slice sits in the full tensor. Vocabulary rows past the full tensor's (tensor
// parallelism pads the vocabulary further) are padding and are skipped, or zero-filled.
#pragma once

#include "tensor/parameters.h"

namespace omni {

// local[p] = this rank's slice of full[p], for every tensor of `local_params`; `full` and
// `local` are buffers laid out like full_params and local_params (values, gradients or an
// optimizer state).
void take_slices(const ParameterSet<float>& full_params, const float* full,
                 const ParameterSet<float>& local_params, float* local);
// The reverse: writes this rank's slices into `full` (other elements untouched). Left out:
// with skip_word_embeddings the word embeddings (the last pipeline stage's copy), with
// skip_replicated the tensors every tensor-parallel rank holds whole (one rank writes them).
void put_slices(const ParameterSet<float>& local_params, const float* local,
                const ParameterSet<float>& full_params, float* full, bool skip_word_embeddings,
                bool skip_replicated);

}  // namespace omni
