#!/usr/bin/env python3
"""Import circles between a crate's modules: exits 1 and prints each strongly connected set.

Usage: tests/import-circles.py SRC_DIR...   (CI: syncer/src orchestrator/src)

A crate whose lib.rs declares its layers (a comment line `// Layers, bottom to top` followed by
groups of `pub mod` lines, each group opened by a comment) is also checked against them: a
top-level module may use modules of its own group or of a group below, never one above.

A module is a file (`a/b.rs` or `a/b/mod.rs` is `a::b`). It imports another when its non-test
code names it: `use` trees (braces expanded), `crate::`/`super::`/`self::` paths, and paths
through a module a `use` brought in or through a child module. Comments and strings are
ignored, and so are test modules. A module using its own ancestor (`super::Engine` in `engine/shared.rs`) is part of
that ancestor, not an import of it; every other edge counts, so two siblings that use each
other, or a parent and a child of a sibling, form a circle.
"""
import os, re, sys


def circles(root, depth=None):
    files={}
    for dp,_,fs in os.walk(root):
        for f in fs:
            if f.endswith('.rs'):
                p=os.path.join(dp,f); rel=os.path.relpath(p,root)[:-3]
                parts=rel.split('/')
                if parts[-1]=='mod': parts=parts[:-1]
                if parts in (['lib'],['main']): parts=[]
                files[tuple(parts)]=p
    # Modules declared under #[cfg(test)] (`mod tests;` in its own file) are tests.
    for m,p in list(files.items()):
        for name in re.findall(r'#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+(\w+)\s*;',open(p).read()):
            files.pop(m+(name,),None)
    def resolve(segs):
        for i in range(len(segs),-1,-1):
            if tuple(segs[:i]) in files: return tuple(segs[:i])
    def strip(src):
        src=re.split(r'#\[cfg\(test\)\]\s*mod',src)[0]
        src=re.sub(r'//[^\n]*','',src)
        src=re.sub(r'"(\\.|[^"\\])*"','""',src)
        return src
    def expand(tree):
        # a::{b, c::{d, e}} -> [a::b, a::c::d, a::c::e]
        # `x as y` keeps `x`; then whitespace goes, so braces split cleanly.
        tree=re.sub(r'\s+as\s+\w+','',tree).replace(' ','').replace('\n','')
        m=re.match(r'^([^{]*)\{(.*)\}$',tree)
        if not m: return [tree]
        pre,body=m.group(1),m.group(2)
        parts=[];depth=0;cur=''
        for ch in body:
            if ch=='{':depth+=1
            if ch=='}':depth-=1
            if ch==',' and depth==0: parts.append(cur);cur=''
            else: cur+=ch
        if cur: parts.append(cur)
        out=[]
        for p in parts:
            for e in expand(p): out.append(pre+e)
        return out
    def absolute(mod,path):
        segs=[s for s in path.split('::') if s]
        base=list(mod)
        if not segs: return None
        if segs[0]=='crate': return segs[1:]
        out=base[:]
        while segs and segs[0] in ('super','self'):
            if segs[0]=='super': out=out[:-1]
            segs=segs[1:]
        if path.startswith(('super','self')): return out+segs
        # relative: a child module of mod?
        if tuple(base+segs[:1]) in files: return base+segs
        return None
    deps={m:set() for m in files}
    for m,p in files.items():
        src=strip(open(p).read())
        alias={}
        for u in re.findall(r'\buse\s+([^;]+);',src):
            for e in expand(u.strip()):
                a=absolute(m,e)
                if a is None: continue
                r=resolve(a)
                if r is not None and r!=m and r!=(): deps[m].add(r)
                # alias for module names imported
                last=e.split('::')[-1]
                if tuple(a) in files: alias[last]=a
        for path in re.findall(r'\b((?:crate|super|self)(?:::[A-Za-z_]\w*)+)',src):
            a=absolute(m,path)
            if a is None: continue
            r=resolve(a)
            if r is not None and r!=m and r!=(): deps[m].add(r)
        for first,rest in re.findall(r'\b([a-z_]\w*)((?:::[A-Za-z_]\w*)+)',src):
            segs=None
            if first in alias: segs=list(alias[first])+rest.split('::')[1:]
            elif tuple(list(m)+[first]) in files: segs=list(m)+[first]+rest.split('::')[1:]
            if segs:
                r=resolve(segs)
                if r is not None and r!=m and r!=(): deps[m].add(r)
    # a parent declaring a child is not an import; a child using its parent's items is not a
    # circle by itself, so parent<-child edges from `super` count only between siblings' sets.
    for m in deps:
        deps[m]={d for d in deps[m] if not (len(d)<len(m) and m[:len(d)]==d)}
    if depth is not None:
        # Top-level modules (folders) as units: an edge between two of their files is an
        # edge between them.
        top={}
        for m,ds in deps.items():
            top.setdefault(m[:depth],set()).update(d[:depth] for d in ds)
        deps={m:{d for d in ds if d!=m} for m,ds in top.items()}
    global DEPS; DEPS=deps
    def name(t): return '::'.join(t) or 'crate'
    idx={};low={};st=[];on=set();res=[];c=[0]
    def sc(v):
        idx[v]=low[v]=c[0];c[0]+=1;st.append(v);on.add(v)
        for w in deps[v]:
            if w not in idx: sc(w);low[v]=min(low[v],low[w])
            elif w in on: low[v]=min(low[v],idx[w])
        if low[v]==idx[v]:
            comp=[]
            while True:
                w=st.pop();on.discard(w);comp.append(w)
                if w==v:break
            if len(comp)>1: res.append(comp)
    for v in deps:
        if v not in idx: sc(v)
    return [(sorted(name(x) for x in r), {name(x): sorted(name(d) for d in deps[x] if d in set(r)) for x in r}) for r in res]


def layers(root):
    """The groups of top-level modules lib.rs declares, bottom first; [] if it declares none."""
    lib=os.path.join(root,'lib.rs')
    if not os.path.exists(lib): return []
    lines=open(lib).read().split('\n')
    try: start=next(i for i,l in enumerate(lines) if l.strip().startswith('// Layers, bottom to top'))
    except StopIteration: return []
    groups=[]
    for l in lines[start+1:]:
        l=l.strip()
        if l.startswith('//'): groups.append([])
        elif l.startswith('pub mod ') and groups: groups[-1].append(l[len('pub mod '):].rstrip(';'))
        elif l=='' or not groups: continue
        else: break
    return [g for g in groups if g]


def upward(root):
    """Edges from a top-level module to one in a higher layer: (from, to) pairs."""
    groups=layers(root)
    if not groups: return []
    level={m:i for i,g in enumerate(groups) for m in g}
    circles(root,1)
    out=[]
    for m,ds in sorted(DEPS.items()):
        if not m or m[0] not in level: continue
        for d in sorted(ds):
            if d and d[0] in level and level[d[0]]>level[m[0]]:
                out.append((m[0],d[0]))
    return out


def main():
    sys.setrecursionlimit(10000)
    found = False
    for root in sys.argv[1:]:
        for level, depth in (("modules", None), ("top-level modules", 1)):
            for members, edges in circles(root, depth):
                found = True
                print(f"{root}: an import circle of {len(members)} {level}:")
                for m in members:
                    print(f"    {m} -> {', '.join(edges[m])}")
        for a,b in upward(root):
            found = True
            print(f"{root}: {a} uses {b}, a layer above it (lib.rs lists the layers)")
    if not found:
        print(f"no import circles or upward imports in {' '.join(sys.argv[1:])}")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
