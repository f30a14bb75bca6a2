// Tensor views, copies and the allocator's counters.
#include <gtest/gtest.h>

#include "common/scalar.hpp"
#include "common/tensor.hpp"

using namespace scalelab;

TEST(Tensor, ShapeStridesAndSize) {
  Tensor t = Tensor::zeros({2, 3, 4});
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.strides(), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(t.defined());
  EXPECT_FALSE(Tensor().defined());
  EXPECT_EQ(t.str(), "(2, 3, 4) f32 cpu");
  for (double v : t.to_vector()) EXPECT_EQ(v, 0.0);
}

TEST(Tensor, DTypes) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_STREQ(dtype_name(DType::f64), "f64");
  Tensor d = Tensor::zeros({5}, DType::f64);
  EXPECT_EQ(d.nbytes(), 40u);
  EXPECT_NO_THROW(d.data<double>());
  EXPECT_THROW(d.data<float>(), CheckFailed);  // the dtype is checked
}

TEST(Tensor, RowsAreViewsWithoutCopy) {
  Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  Tensor r = t.rows(1, 3);
  EXPECT_EQ(r.shape(), (std::vector<int64_t>{2, 2}));
  EXPECT_TRUE(r.shares_storage_with(t));
  EXPECT_EQ(r.to_vector(), (std::vector<double>{2, 3, 4, 5}));
  r.data<float>()[0] = 42;  // writes through to the parent
  EXPECT_EQ(t.item(2), 42);
  EXPECT_THROW(t.rows(3, 5), CheckFailed);
}

TEST(Tensor, FlatAndView) {
  Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor f = t.flat(2, 3);
  EXPECT_EQ(f.to_vector(), (std::vector<double>{2, 3, 4}));
  Tensor v = t.view({3, -1});
  EXPECT_EQ(v.shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(v.item(5), 5);
  // a view of a view of rows keeps the offset
  Tensor rv = t.rows(1, 2).view({3});
  EXPECT_EQ(rv.to_vector(), (std::vector<double>{3, 4, 5}));
  EXPECT_THROW(t.view({4}), CheckFailed);
  EXPECT_THROW(t.flat(4, 3), CheckFailed);
}

TEST(Tensor, CloneAndCopyFrom) {
  Tensor t = Tensor::from_vector({1, 2, 3}, {3});
  Tensor c = t.clone();
  EXPECT_FALSE(c.shares_storage_with(t));
  c.data<float>()[0] = 9;
  EXPECT_EQ(t.item(0), 1);
  Tensor d = Tensor::zeros({3});
  d.copy_from(c);
  EXPECT_EQ(d.to_vector(), (std::vector<double>{9, 2, 3}));
  EXPECT_THROW(d.copy_from(Tensor::zeros({4})), CheckFailed);
}

TEST(Allocator, CountsCurrentAndPeak) {
  const Device cpu = Device::cpu();
  const std::size_t base = memory_stats(cpu).current;
  reset_peak_memory(cpu);
  {
    Tensor a = Tensor::empty({1000});  // 4000 bytes
    EXPECT_EQ(memory_stats(cpu).current, base + 4000);
    {
      Tensor b = Tensor::empty({500}, DType::f64);  // 4000 bytes
      Tensor view = b.rows(0, 10);                  // no allocation
      EXPECT_EQ(memory_stats(cpu).current, base + 8000);
    }
    EXPECT_EQ(memory_stats(cpu).current, base + 4000);
  }
  EXPECT_EQ(memory_stats(cpu).current, base);
  EXPECT_EQ(memory_stats(cpu).peak, base + 8000);
  reset_peak_memory(cpu);
  EXPECT_EQ(memory_stats(cpu).peak, base);
}

TEST(Device, NamesAndParse) {
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device::cuda(1).str(), "cuda:1");
  EXPECT_TRUE(Device::parse("cuda").is_cuda());
  EXPECT_EQ(Device::parse("cuda:2").index, 2);
  EXPECT_THROW(Device::parse("tpu"), UsageError);
  EXPECT_EQ(Device::sim().str(), "sim");
  EXPECT_TRUE(Device::parse("sim").is_sim());
  EXPECT_NE(Device::sim(), Device::cpu());
}

// The simulated GPU: host memory that host code reaches only through copies and the ops, as a
// GPU's. data<T>() throws outside a kernel (an op's SimKernelScope), naming the tensor; copies,
// to_vector() and the ops work; the allocator counts it apart from the host.
TEST(Tensor, SimulatedGpuRefusesHostReadsOutsideOps) {
  const MemoryStats host0 = memory_stats(Device::cpu()), sim0 = memory_stats(Device::sim());
  Tensor s = Tensor::from_vector({1, 2, 3}, {3}).to(Device::sim());
  EXPECT_EQ(memory_stats(Device::sim()).current - sim0.current, 12u);
  EXPECT_EQ(memory_stats(Device::cpu()).current, host0.current);  // the host copy is gone
  try {
    (void)s.data<float>();
    ADD_FAILURE() << "data<float>() of a sim tensor outside an op did not throw";
  } catch (const CheckFailed& e) {
    EXPECT_NE(std::string(e.what()).find("the elements of (3) f32 sim through data<T>(), outside an op"),
              std::string::npos) << e.what();
  }
  const Tensor& cs = s;
  EXPECT_THROW((void)cs.data<float>(), CheckFailed);
  EXPECT_THROW((void)s.item(0), CheckFailed);  // as on a GPU: copy it to the host first
  EXPECT_EQ(s.to_vector(), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(s.to(Device::cpu()).data<float>()[2], 3.0f);
  {
    const SimKernelScope in_kernel;  // what an op opens around its CPU kernel
    EXPECT_EQ(s.data<float>()[1], 2.0f);
  }
  EXPECT_THROW((void)s.data<float>(), CheckFailed);  // closed again
  Tensor c = Tensor::zeros({3});
  c.copy_from(s);  // a copy between the devices, as cudaMemcpy
  EXPECT_EQ(c.to_vector(), s.to_vector());
}

// The doors between tensors and host numbers count the bytes they pass, at each dtype's size;
// views, copies and data<T>() pass none.
TEST(Tensor, HostValueBytesCountToVectorItemAndFromVector) {
  const HostValueBytes b0 = host_value_bytes();
  Tensor t = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f64);  // 48 bytes in
  Tensor i = Tensor::from_vector({0, 1}, {2}, DType::i32);                 // 8 bytes in
  HostValueBytes b = host_value_bytes();
  EXPECT_EQ(b.written - b0.written, 56);
  EXPECT_EQ(b.read - b0.read, 0);
  EXPECT_EQ(t.rows(1, 2).to_vector(), (std::vector<double>{4, 5, 6}));  // 24 bytes out
  EXPECT_EQ(i.item(1), 1.0);                                              // 4 bytes out
  b = host_value_bytes();
  EXPECT_EQ(b.read - b0.read, 28);
  EXPECT_EQ(b.total() - b0.total(), 84);
  // on the tensors' side of the doors: nothing
  Tensor c = t.clone();
  c.copy_from(t);
  c.data<double>()[0] = 7;
  EXPECT_EQ(host_value_bytes().total(), b.total());
  // a whole tensor read back is one host read (scalar.hpp), on the host and on a device: on a
  // GPU it waits for every kernel queued before it
  const int64_t reads = host_reads();
  (void)t.to_vector();
  (void)t.to(Device::sim()).to_vector();
  EXPECT_EQ(host_reads() - reads, 2);
}
