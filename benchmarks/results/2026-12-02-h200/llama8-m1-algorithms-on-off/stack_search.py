import copy,gc,json,shutil,sys,time,datetime,importlib.metadata as md
from pathlib import Path
import torch
sys.path.insert(0,"benchmarks")
import llama_stack, autoao
from autoao import runfiles, search_space
out=Path(sys.argv[1]); out.mkdir(parents=True,exist_ok=True); T=int(sys.argv[2])
dev=torch.device("cuda"); sh=llama_stack.LlamaShape()
base=llama_stack.build(sh,device=dev).requires_grad_(False)
g=torch.Generator(device=dev).manual_seed(1)
x=torch.randint(0,sh.vocab,(1,1),device=dev,generator=g)
held=[torch.randint(0,sh.vocab,(1,256),device=dev,generator=g)]
cal=[f"int4_wo(group_size=128, algorithm={a})" for a in ("gptq","awq","hqq")]+["int8_dyn(algorithm=smoothquant)"]
dflt=[c.name for c in search_space.all_candidates()]
res={"env":{"date":datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),"gpu":torch.cuda.get_device_name(0),"torch":torch.__version__,**{p:md.version(p) for p in ("triton","transformers","optuna")}},"trials":T,"calibrated":cal,"runs":[]}
for alg,c in (("off",None),("on",dflt+cal)):
    w=Path("/tmp/rows")/alg; shutil.rmtree(w,ignore_errors=True); m=copy.deepcopy(base); t0=time.perf_counter()
    r=autoao.optimize(m,x,budget=T,eval_inputs=held,max_accuracy_drop=1.0,candidates=c,out_dir=w,progress=False)
    s=r.summary
    row={"algorithms":alg,"wall_s":time.perf_counter()-t0,"plan":r.plan.summary(),"fused":len(r.plan.fusions),"trials":s.trials,"seconds":s.seconds,"stage_seconds":s.stage_seconds,"algorithm_seconds":getattr(s,"algorithm_seconds",None),"speedup_measured":s.speedup.measured,"speedup_predicted":s.speedup.predicted,"speedup_range":s.speedup_range,"baseline_ms":s.baseline_ms.measured,"plan_ms":s.plan_ms.measured,"decisions":[runfiles.describe(d) for d in s.decisions]}
    for n in ("summary","context"): shutil.copy(w/f"{n}.json",out/f"stack_{alg}_{n}.json")
    res["runs"].append(row); print(json.dumps(row,default=str)[:1800],flush=True)
    (out/"stack.json").write_text(json.dumps(res,indent=2,default=str))
    del m,r; gc.collect(); torch.cuda.empty_cache()
