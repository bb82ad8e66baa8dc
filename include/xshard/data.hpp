#pragma once
/// \file
/// The data pipeline: datasets, range-v3 views with MindSpore's dataset semantics, the
/// mesh loader that deals global batches out as distributed tensors, the MNIST / CIFAR-10
/// readers, a text corpus and a synthetic classification task (data/).

#include <xshard/data/dataset.hpp>
#include <xshard/data/loader.hpp>
#include <xshard/data/random.hpp>
#include <xshard/data/readers.hpp>
#include <xshard/data/synthetic.hpp>
#include <xshard/data/text.hpp>
#include <xshard/data/views.hpp>
