#pragma once
/// \file
/// Pipeline parallelism: schedules as tables and their analysis, stages, micro-batches,
/// the transfers between stages and the pipeline runtime, and a pipeline's checkpoints
/// (pipeline/).

#include <xshard/pipeline/action.hpp>
#include <xshard/pipeline/analysis.hpp>
#include <xshard/pipeline/boundary.hpp>
#include <xshard/pipeline/chain.hpp>
#include <xshard/pipeline/checkpoint.hpp>
#include <xshard/pipeline/micro_batch.hpp>
#include <xshard/pipeline/pipeline.hpp>
#include <xshard/pipeline/schedule.hpp>
#include <xshard/pipeline/stages.hpp>
#include <xshard/pipeline/transfer.hpp>
