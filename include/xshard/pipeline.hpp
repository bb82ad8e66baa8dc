#pragma once
/// \file
/// Pipeline parallelism: schedules as tables and their analysis, stages, micro-batches,
/// the transfers between stages and the pipeline runtime (pipeline/). A pipeline's
/// checkpoints are in xshard/io.hpp, with the other checkpoints.

#include <xshard/pipeline/action.hpp>
#include <xshard/pipeline/analysis.hpp>
#include <xshard/pipeline/boundary.hpp>
#include <xshard/pipeline/chain.hpp>
#include <xshard/pipeline/micro_batch.hpp>
#include <xshard/pipeline/pipeline.hpp>
#include <xshard/pipeline/schedule.hpp>
#include <xshard/pipeline/slots.hpp>
#include <xshard/pipeline/stage_view.hpp>
#include <xshard/pipeline/stages.hpp>
#include <xshard/pipeline/step.hpp>
#include <xshard/pipeline/step_batch.hpp>
#include <xshard/pipeline/step_transfers.hpp>
#include <xshard/pipeline/topology.hpp>
#include <xshard/pipeline/transfer.hpp>
